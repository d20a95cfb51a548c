"""The agent image's pure parts: what its cache key covers, the lock against pyproject, apt's sources."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from netclaim.errors import PrerequisiteError
from netclaim_lab import agent_image


def _checkout(root: Path) -> None:
    (root / "src" / "netclaim" / "__pycache__").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'netclaim'\n")
    (root / "src" / "netclaim" / "__init__.py").write_text("")
    (root / "src" / "netclaim" / "cli.py").write_text("def main() -> int:\n    return 0\n")


def _hash(root: Path) -> str:
    return agent_image.files_hash("base", agent_image.source_files(root), root)


def test_inputs_hash_follows_sources_and_ignores_caches(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _checkout(first)
    _checkout(second)
    assert _hash(first) == _hash(second)  # names are relative to the checkout
    (first / "src" / "netclaim" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    (first / "src" / "netclaim.egg-info").mkdir()
    (first / "src" / "netclaim.egg-info" / "PKG-INFO").write_text("Name: netclaim\n")
    assert _hash(first) == _hash(second)
    (first / "src" / "netclaim" / "cli.py").write_text("def main() -> int:\n    return 1\n")
    assert _hash(first) != _hash(second)
    before = _hash(second)
    (second / "src" / "netclaim" / "cli.py").rename(second / "src" / "netclaim" / "main.py")
    assert _hash(second) != before  # a renamed module is another wheel
    assert agent_image.files_hash("other base", agent_image.source_files(first), first) != _hash(first)


def test_the_current_checkout_hashes_stably() -> None:
    assert agent_image.inputs_hash() == agent_image.inputs_hash()
    assert agent_image.base_hash() != agent_image.inputs_hash()


def test_committed_lock_pins_every_dependency_of_pyproject() -> None:
    agent_image.check_lock()
    locked = agent_image.locked_versions()
    assert {"multidict", "pydantic-core", "h2"} <= locked.keys()  # transitive ones too
    pins = re.split(r"^(?=\S)", agent_image.LOCK_FILE.read_text(), flags=re.M)
    hashes = {p.split("==")[0]: p.count("--hash=sha256:") for p in pins if "==" in p}
    assert hashes.keys() == locked.keys() and set(hashes.values()) <= {1, 2}
    # a compiled wheel differs by architecture: one hash for x86_64's, one for aarch64's
    assert {name: hashes[name] for name in ("msgspec", "pydantic-core", "protobuf")} == dict.fromkeys(
        ("msgspec", "pydantic-core", "protobuf"), 2
    )


def test_lock_out_of_step_with_pyproject_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["pyyaml==6.0.3", "httpx2[http2]==2.1"]\n'
    )
    (tmp_path / "lock").write_text(
        "pyyaml==6.0.3 \\\n    --hash=sha256:00\nhttpx2==2.0 \\\n    --hash=sha256:11\n"
    )
    with pytest.raises(PrerequisiteError, match=r"httpx2==2\.1.*--relock"):
        agent_image.check_lock(tmp_path / "pyproject.toml", tmp_path / "lock")
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["pyyaml>=6"]\n')
    with pytest.raises(PrerequisiteError, match="exact == pin"):
        agent_image.check_lock(tmp_path / "pyproject.toml", tmp_path / "lock")


def test_package_list_drops_comments() -> None:
    packages = agent_image.debian_packages()
    assert {"python3", "iptables", "nftables", "ca-certificates"} <= set(packages)
    assert not [p for p in packages if "#" in p]


def test_apt_sources_take_the_hosts_debian_entries(tmp_path: Path) -> None:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n"
        "deb-src http://mirror.example/debian bookworm main\n"
    )
    (etc / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /keyring.gpg\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\nEnabled: no\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: trixie\nComponents: main\n"
    )
    (etc / "sources.list.d" / "other.list").write_text("deb https://vendor.example/apt stable main\n")
    assert agent_image.apt_sources(etc) == [
        "deb [signed-by=/k.gpg] http://mirror.example/debian bookworm main",  # not again: /keyring.gpg
        "deb [signed-by=/keyring.gpg] http://mirror.example/debian bookworm-updates main",
        "deb http://security.example/debian-security bookworm-security main",
    ]
    assert agent_image.apt_sources(tmp_path / "none")[0] == "deb http://deb.debian.org/debian bookworm main"


@pytest.mark.parametrize("reference", ["registry.example.com/netclaim:0.1.0", "localhost:5000/netclaim:dev"])
def test_references_name_a_tag(reference: str) -> None:
    assert agent_image.check_reference(reference) == reference


@pytest.mark.parametrize("reference", ["registry.example.com/netclaim", "localhost:5000/netclaim", "x:"])
def test_references_without_a_tag_are_refused(reference: str) -> None:
    with pytest.raises(PrerequisiteError, match="tag"):
        agent_image.check_reference(reference)


def test_the_hosts_launchers_leave_no_trace_in_the_image(tmp_path: Path) -> None:
    """pip's console scripts carry the host interpreter's path in their shebang: their RECORD hashes made
    two clones of the same commit build different digests."""
    site = tmp_path / "site"
    (site / "bin").mkdir(parents=True)
    (site / "bin" / "idna").write_text("#!/tmp/clone-1/.venv/bin/python\n")
    info = site / "idna-3.20.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(
        "../../bin/idna,sha256=QcdM,167\nidna/__init__.py,sha256=abc,849\nidna-3.20.dist-info/RECORD,,\n"
    )
    agent_image.drop_launchers(site)
    assert not (site / "bin").exists()
    assert (info / "RECORD").read_text() == "idna/__init__.py,sha256=abc,849\nidna-3.20.dist-info/RECORD,,\n"
