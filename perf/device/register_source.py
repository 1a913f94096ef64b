"""Make a source tree on PYTHONPATH look installed to importlib.metadata: write a dist-info for grail-rl into SITE.

A GPU machine without internet access runs grail-rl from the working tree (`PYTHONPATH=/tmp/site:$PWD/src`), which
has no installed metadata, so entry points are not found: the plug-in methods of pyproject.toml
(`grail_over_surprise` among them) would be missing from the method table. This writes
`SITE/grail_rl-VERSION.dist-info/` with METADATA and entry_points.txt taken from pyproject.toml, as `pip install`
would.

    python3 perf/device/register_source.py /tmp/site [pyproject.toml]
"""

import pathlib
import sys
import tomllib


def register(site: pathlib.Path, pyproject: pathlib.Path) -> pathlib.Path:
    """Write the dist-info for the project of `pyproject` into `site`; return its folder."""
    project = tomllib.loads(pyproject.read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    (info / "entry_points.txt").write_text("\n".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        for group, points in groups.items() if points))
    return info


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    print(register(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2] if len(sys.argv) == 3 else "pyproject.toml")))
