"""Development tools, run from the repository root (`python -m tools.NAME`): they read and
write the source tree (docs/, screenshots/), so they are not part of the installed package."""
