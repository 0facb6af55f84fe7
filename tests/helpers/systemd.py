"""systemd/edgeasr.service read as systemd reads it, and its system call filter applied to a child
process with libseccomp, the library systemd itself uses (systemd is not PID 1 here, so the unit
never runs): for tests/test_systemd_unit.py and tests/test_deb.py."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
from pathlib import Path

from helpers import REPO

UNIT = REPO / "systemd" / "edgeasr.service"


def unit_settings(unit: Path = UNIT) -> dict[str, list[str]]:
    """Key -> values in file order (repeated keys accumulate, as systemd's list settings do)."""
    settings: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000


def SCMP_ACT_ERRNO(code: int) -> int:  # libseccomp's macro name
    return 0x00050000 | (code & 0xFFFF)


class ScmpArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def syscall_groups() -> dict[str, list[str]]:
    """`systemd-analyze syscall-filter`: @group -> members (syscalls and @groups)."""
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True,
                         text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif not line.startswith(" "):
            current = None
        elif current is not None and not line.strip().startswith("#"):
            current.append(line.strip())
    return groups


def expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    calls: set[str] = set()
    for name in names:
        calls |= expand(groups[name], groups) if name.startswith("@") else {name}
    return calls


def allowed_syscalls(filters: list[str]) -> set[str]:
    """systemd's semantics: the first allow-list starts from @default, `~` lines remove."""
    groups = syscall_groups()
    allowed = expand(["@default"], groups)
    for line in filters:
        if line.startswith("~"):
            allowed -= expand(line[1:].split(), groups)
        else:
            allowed |= expand(line.split(), groups)
    return allowed


class SyscallSandbox:
    """A preexec_fn applying the unit's SystemCallFilter= and SystemCallErrorNumber= (and,
    if asked, the rules systemd 252 uses for MemoryDenyWriteExecute=) to the child."""

    def __init__(self, unit: Path = UNIT, deny_write_execute: bool = False) -> None:
        settings = unit_settings(unit)
        self._lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
        self._lib.seccomp_init.restype = ctypes.c_void_p
        self._lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        self._lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                               ctypes.c_uint]
        self._lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32,
                                                     ctypes.c_int, ctypes.c_uint,
                                                     ctypes.POINTER(ScmpArgCmp)]
        self._lib.seccomp_load.argtypes = [ctypes.c_void_p]
        code = getattr(errno, settings["SystemCallErrorNumber"][0])
        self.allowed = allowed_syscalls(settings["SystemCallFilter"])
        # systemd loads the allow-list last: it denies seccomp(2) itself.
        self._filters = [self._deny_write_execute()] if deny_write_execute else []
        self._filters.append(self._allow_list(self.allowed, code))

    def _resolve(self, name: str) -> int:
        return self._lib.seccomp_syscall_resolve_name(name.encode())

    def _allow_list(self, names: set[str], code: int) -> int:
        ctx = self._lib.seccomp_init(SCMP_ACT_ERRNO(code))
        for name in sorted(names):
            nr = self._resolve(name)
            if nr >= 0:  # not a syscall on this architecture
                assert self._lib.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) == 0, name
        return ctx

    def _deny_write_execute(self) -> int:
        """A second filter, as systemd stacks one: mmap W+X, mprotect +X, shmat SHM_EXEC."""
        ctx = self._lib.seccomp_init(SCMP_ACT_ALLOW)
        rules = [("mmap", PROT_WRITE | PROT_EXEC), ("mprotect", PROT_EXEC),
                 ("pkey_mprotect", PROT_EXEC), ("shmat", SHM_EXEC)]
        for name, mask in rules:
            nr = self._resolve(name)
            if nr >= 0:
                cmp = ScmpArgCmp(2, SCMP_CMP_MASKED_EQ, mask, mask)
                assert self._lib.seccomp_rule_add_array(
                    ctx, SCMP_ACT_ERRNO(errno.EPERM), nr, 1, ctypes.byref(cmp)) == 0, name
        return ctx

    def __call__(self) -> None:
        # Runs in the child after Popen switched user and groups; seccomp_load also sets
        # no_new_privs (libseccomp's default), like the unit's NoNewPrivileges=.
        for ctx in self._filters:
            if self._lib.seccomp_load(ctx) != 0:
                os.write(2, b"seccomp_load failed\n")
                os._exit(121)
