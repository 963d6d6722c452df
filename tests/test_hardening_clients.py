"""The console's own clients and files, hardened: no proxy from the environment, bounded
answers, and a fleet.toml write-back that keeps links, modes and other people's edits.

Real processes on loopback: a real agent, a real gateway, and a real (tiny) HTTP proxy
that records every connection made to it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from console.core.config import load_fleet
from console.gateway.routes import FleetFileChanged, save_to_fleet

FLEET = """\
# production routes: this comment must survive
[fleet]
name = "wb"

[[nodes]]
name = "n1"
agent = "http://127.0.0.1:9"

[[models]]
name = "tiny"

  [[models.deployments]]
  id = "tiny-a"   # the main one
  node = "n1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:9"
  weight = 100

  [[models.deployments]]
  id = "tiny-b"
  node = "n1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:9"
  weight = 0
"""


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# -- fleet.toml write-back ------------------------------------------------------------------


def test_saving_routes_through_a_symlinked_fleet_file_updates_the_target_and_keeps_the_link(
    tmp_path,
):
    real = tmp_path / "config" / "fleet.toml"
    real.parent.mkdir()
    real.write_text(FLEET)
    real.chmod(0o640)
    link = tmp_path / "fleet.toml"
    link.symlink_to(real)
    fleet = load_fleet(link)
    changed = save_to_fleet(fleet, {"tiny": {"tiny-a": 30, "tiny-b": 70}})
    assert sorted(changed) == ["tiny/tiny-a 100->30", "tiny/tiny-b 0->70"]
    assert link.is_symlink() and os.readlink(link) == str(real)
    text = real.read_text()
    assert "weight = 30" in text and "weight = 70" in text
    assert "# production routes: this comment must survive" in text
    assert 'id = "tiny-a"   # the main one' in text
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert leftovers(real.parent) == [] and leftovers(tmp_path) == []


def test_a_second_save_after_the_first_is_not_taken_for_someone_elses_edit(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    save_to_fleet(fleet, {"tiny": {"tiny-a": 30, "tiny-b": 70}})
    changed = save_to_fleet(fleet, {"tiny": {"tiny-a": 0, "tiny-b": 100}})
    assert sorted(changed) == ["tiny/tiny-a 30->0", "tiny/tiny-b 70->100"]


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ("weight = 0\n", "weight = 5  # an operator's hand edit\n"),
        ('name = "wb"', 'name = "wb-renamed"'),
        ('name = "wb"', 'name = "wb" ['),  # half-saved by an editor: not even TOML
    ],
    ids=["weight", "other key", "unparsable"],
)
def test_a_fleet_file_edited_since_it_was_loaded_is_not_overwritten(tmp_path, edit, why):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    edited = FLEET.replace(edit, why, 1)
    path.write_text(edited)
    with pytest.raises(FleetFileChanged) as refused:
        save_to_fleet(fleet, {"tiny": {"tiny-a": 30, "tiny-b": 70}})
    message = str(refused.value)
    assert message.startswith(f"{path}: changed on disk since the gateway loaded it"), message
    assert "reload the gateway (SIGHUP)" in message
    assert path.read_text() == edited  # the edit is kept, byte for byte
    assert leftovers(tmp_path) == []  # and nothing half-written lies next to it


def test_a_fleet_file_with_only_a_new_comment_is_saved_with_the_comment(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    path.write_text("# a note added by hand\n" + FLEET)
    save_to_fleet(fleet, {"tiny": {"tiny-a": 30}})
    text = path.read_text()
    assert text.startswith("# a note added by hand\n") and "weight = 30" in text
