"""Network namespaces of ours and a byte relay between namespaces: the plumbing under
:mod:`.links`.

A :class:`Netns` is held by an ``unshare -n sleep infinity`` process (``PR_SET_PDEATHSIG``: it
dies with the thread that started it) and vanishes with the last process in it. Commands run
in it with ``nsenter``; Python code runs in it in a thread that entered it with ``setns(2)``
(a socket belongs to the namespace it was created in, whichever thread uses it later), which
is how one relay holds a listener in one namespace and its upstream connections in another.
Nothing here is ever created in the namespace this process started in. It knows nothing about
links, rates or Toxiproxy.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, TypeVar

from astraflow.errors import FatalError, RetriableError

__all__ = ["LinkError", "LinkUnavailable", "Netns", "Relay", "call_in", "check_capabilities", "die_with_parent"]

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_CHUNK = 65536
T = TypeVar("T")


class LinkUnavailable(FatalError):
    """This machine cannot emulate links: a tool or a permission is missing (the message says which)."""


class LinkError(RetriableError):
    """A step of building or driving a link failed (a command, Toxiproxy's API)."""


# -- network namespaces -----------------------------------------------------------------------

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def die_with_parent() -> None:
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise LinkError(f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


class Netns:
    """A network namespace of ours: held by an ``unshare -n sleep infinity`` process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fd = -1
        self.holder = subprocess.Popen(["unshare", "-n", "sleep", "infinity"], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       preexec_fn=die_with_parent)
        self.path = f"/proc/{self.holder.pid}/ns/net"
        home = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        # Until unshare(2) has run the holder is still in our namespace: never touch it before.
        while True:
            if self.holder.poll() is not None:
                err = self.holder.stderr.read().decode(errors="replace").strip() if self.holder.stderr else ""
                self.close()
                raise LinkUnavailable(f"'unshare -n' could not make a network namespace "
                                      f"({err or f'exit {self.holder.returncode}'}); link emulation needs root "
                                      "(CAP_SYS_ADMIN, CAP_NET_ADMIN) and util-linux's unshare")
            with contextlib.suppress(OSError):
                if os.readlink(self.path) != home:
                    break
            if time.monotonic() > deadline:
                self.close()
                raise LinkError(f"namespace holder {self.holder.pid} never left the home namespace")
            time.sleep(0.005)
        self.inode = os.readlink(self.path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def alive(self) -> bool:
        return self.holder.poll() is None

    def enter_argv(self) -> list[str]:
        """The argv prefix that runs a command in this namespace."""
        return ["nsenter", f"--net={self.path}", "--"]

    def run(self, *argv: str) -> str:
        """Run a command (``ip``, ``tc``) in this namespace; its stdout. Raises :class:`LinkError`."""
        if not self.alive() or os.readlink(self.path) != self.inode:
            raise LinkError(f"namespace {self.name} is gone (its holder {self.holder.pid} exited)")
        # through our own descriptor of the namespace, not the holder's pid (which could be reused)
        p = subprocess.run(["nsenter", f"--net=/proc/self/fd/{self.fd}", "--", *argv], capture_output=True,
                           text=True, timeout=30, pass_fds=(self.fd,))
        if p.returncode != 0:
            why = p.stderr.strip() or f"exit {p.returncode}"
            raise LinkError(f"in namespace {self.name}: {' '.join(argv)}: {why}")
        return p.stdout

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a thread inside this namespace (sockets it creates stay in it); its result."""
        return call_in(self.fd, fn)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1
        if self.holder.poll() is None:
            self.holder.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.holder.wait(5)
        if self.holder.stderr:
            self.holder.stderr.close()


def call_in(fd: int | None, fn: Callable[[], T]) -> T:
    box: dict = {}

    def body() -> None:
        try:
            if fd is not None:
                _setns(fd)
            box["ok"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["err"] = e
    t = threading.Thread(target=body, name="netns-call", daemon=True)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box["ok"]


_checked: str | None = None


def check_capabilities() -> None:
    """Raise :class:`LinkUnavailable` naming what is missing unless this machine can build a link
    (``ip``, ``tc``, ``unshare``, ``nsenter``; namespaces, veth pairs and the ``tbf`` qdisc)."""
    global _checked
    if _checked == "ok":
        return
    missing = [tool for tool in ("ip", "tc", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        raise LinkUnavailable(f"link emulation needs {', '.join(missing)} on PATH "
                              "(Debian: apt-get install iproute2 util-linux)")
    ns = Netns("probe")
    try:
        ns.run("ip", "link", "add", "afprobe0", "type", "veth", "peer", "name", "afprobe1")
        try:
            ns.run("tc", "qdisc", "add", "dev", "afprobe0", "root", "tbf", "rate", "8mbit", "burst", "16kb",
                   "latency", "100ms")
        except LinkError as e:
            raise LinkUnavailable(f"the kernel refused a tbf qdisc on a veth pair ({e}); link emulation needs "
                                  "sch_tbf") from e
    except LinkError as e:
        raise LinkUnavailable(f"cannot make a veth pair in a network namespace ({e}); link emulation needs root "
                              "and the veth driver") from e
    finally:
        ns.close()
    _checked = "ok"


# -- the byte relay -----------------------------------------------------------------------------

class Relay:
    """Accept on ``listener``; per connection, connect to ``upstream`` from namespace ``connect_fd``
    (None: the accepting thread's own) and copy bytes both ways, counting them."""

    def __init__(self, listener: socket.socket, upstream: tuple[str, int], connect_fd: int | None,
                 count: Callable[[bool, int], None], name: str) -> None:
        self.listener, self.upstream, self.count, self.name = listener, upstream, count, name
        self.port = listener.getsockname()[1]
        self.connections = 0
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._closed = False
        self._connect_fd = connect_fd
        threading.Thread(target=self._accept, name=f"relay-{name}", daemon=True).start()

    def _accept(self) -> None:
        if self._connect_fd is not None:
            _setns(self._connect_fd)  # this thread only: connections to the upstream start from there
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    _close(client)
                    _close(upstream)
                    return
                self._socks |= {client, upstream}
                self.connections += 1
            pair = _Pair(self, client, upstream)
            threading.Thread(target=pair.pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=pair.pump, args=(upstream, client, False), daemon=True).start()

    def forget(self, *socks: socket.socket) -> None:
        with self._lock:
            self._socks.difference_update(socks)

    def close(self) -> None:
        self._closed = True
        _close(self.listener)
        with self._lock:
            socks, self._socks = list(self._socks), set()
        for s in socks:
            _close(s)


class _Pair:
    def __init__(self, relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        self.relay, self.client, self.upstream = relay, client, upstream
        self._ended = 0
        self._lock = threading.Lock()

    def pump(self, src: socket.socket, dst: socket.socket, outbound: bool) -> None:
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
                self.relay.count(outbound, len(data))
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # pass the FIN on; the other direction may go on
        except OSError:
            self._end(force=True)
            return
        self._end(force=False)

    def _end(self, force: bool) -> None:
        with self._lock:
            self._ended += 1
            done = force or self._ended == 2
        if done:
            _close(self.client)
            _close(self.upstream)
            self.relay.forget(self.client, self.upstream)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()

