"""The command line's usage errors: one line that says what is wrong, exit 2, never a
Python traceback."""

from __future__ import annotations

from tests.conftest import run_cli


def test_a_set_without_a_value_is_a_usage_error_not_a_traceback(tmp_path):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[fleet]\nname = "t"\n\n[[nodes]]\nname = "n"\nagent = "http://127.0.0.1:9"\n')
    ran = run_cli("vllm", "start", "--profile", "p", "--node", "n", "--fleet", str(fleet),
                  "--set", "foo")  # fmt: skip
    assert ran.returncode == 2, ran.stderr
    assert "argument --set: wants KEY=VALUE, got 'foo'" in ran.stderr
    assert "Traceback" not in ran.stderr
