"""Folders made for a run's files, each one recorded so that a refused or failed run can
remove exactly what it made (``runtime.output.MADE_FOLDERS`` for outputs,
``state.spill_store.SpillStore.made`` for a spill folder)."""

from __future__ import annotations

from pathlib import Path


def make_folders(folder: Path, made: list[Path]) -> None:
    """``folder`` and its missing parents, each one created appended to ``made`` as it is
    made (so a failure part-way still records the ones made before it). Raises OSError."""
    missing = []
    p = Path(folder).absolute()  # (recorded so: removed where it was made, whatever the cwd)
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:  # (made meanwhile, or NAME/.. of a folder just made)
            if not d.is_dir():
                raise
            continue
        made.append(d)
