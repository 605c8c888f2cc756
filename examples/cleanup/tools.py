"""Tools of the cleanup example: a read and a destructive write (the policy asks before the latter)."""

import os

import stead


@stead.tool(effects="read")
def list_files() -> list[str]:
    """The files in the current directory."""
    return sorted(name for name in os.listdir(".") if os.path.isfile(name))


@stead.tool(effects="write", destructive=True)
def remove_file(path: str) -> str:
    """Remove a file from the current directory.

    Args:
        path: the file's name (no directories)
    """
    if os.path.basename(path) != path or not os.path.isfile(path):
        raise ValueError(f"{path!r} is not a file in the current directory")
    os.remove(path)
    return f"removed {path}"
