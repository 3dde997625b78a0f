"""No command of ``epsilon-market`` shows a person a traceback, whatever goes wrong.

Every command is found in the parser itself (a new command is walked without a change here)
and run with the mistakes people make: a dead broker in the environment, every ``EMARKET_*``
variable garbled, each file it takes missing, a directory, not text or not what it should
hold, and Ctrl-C while it waits or starts. Each must end within its stated timeout with a
message, never a traceback nor the last-resort "this is a bug" line
(:func:`streams.clients.cli.main`). The dead broker and Ctrl-C are run as a person would, in a
subprocess; the files and the environment (hundreds of cases) by ``main`` in this process,
where an exception escaping it is the traceback a person would see.

An option that names a file says so (``FILE`` as its metavar, or a name ending in ``file``):
that is how the walk knows which options to hand a bad file.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from streams.broker.embedded import find_free_port
from streams.clients.cli import build_parser, main
from streams.clients.parser import GLOBAL_OPTIONS, CommandParser
from streams.worker.data_lock import DataDirInUse, hold_data_dir

from ..conftest import Market

ROOT = Path(__file__).resolve().parents[3]
GARBAGE = b"\x00\xff\xfe not what it should be {[\n\x80"
TEXT = b'{"value_id": 7, "values": "no"}\n[1, 2\nkey,count\na,-1.5\n'  # UTF-8, not valid
STATED = 5.0  # what a command may wait here: its --timeout, or at most serve's --broker-wait
SLACK = 20.0  # seconds a command may take beyond it on a busy CPU
BUG_MARKS = ("Traceback", "this is a bug")
Command = tuple[str, ...]


def commands() -> dict[Command, CommandParser]:
    """Every command of the CLI (``("account", "open")`` for a subcommand) and its parser."""
    return dict(build_parser().commands())


def options(parser: CommandParser) -> Iterator[argparse.Action]:
    return (a for a in parser.options if a.dest != "help")


def takes_file(a: argparse.Action) -> bool:
    return a.metavar == "FILE" or a.dest.endswith("file")


class Case:
    """Arguments that make every command runnable: its required options filled in."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.key = tmp / "a1.key"
        r = run(["keygen", "--account", "a1", "--out", str(self.key)], env=clean_env())
        assert r.returncode == 0, r.stderr
        self.outcome = tmp / "outcome.json"
        self.outcome.write_text('{"stream_id": "s1"}')
        self.n = 0

    def value(self, a: argparse.Action) -> str:
        self.n += 1
        by_dest = {
            "key_file": str(self.key),
            "new_key_file": str(self.key),
            "event": str(self.outcome),
            "out": str(self.tmp / f"new-{self.n}"),
            "max_price": "1.00",
            "steps": "1,2",
            "version": "2",
            "data_dir": str(self.tmp / f"data-{self.n}"),
            "web_port": str(find_free_port()),
            "timeout": f"{STATED:g}",
            "values": "1",
        }
        if a.dest in by_dest:
            return by_dest[a.dest]
        if a.choices:
            return str(next(iter(a.choices)))
        return "2" if a.type in (int, float) else "x1"

    def argv(self, command: Command, parser: CommandParser, **given: str) -> list[str]:
        """``command`` with its required options, the optional ones a run needs (a data
        directory and web port of its own, a short timeout) and ``given`` (dest -> value; a
        dest the command does not have is left out)."""
        argv = list(command)
        for a in options(parser):
            wanted = a.required or a.dest in ("key_file", "data_dir", "web_port", "timeout")
            if a.dest == "values":  # what publish sends, unless a file is given
                wanted = not {"file", "counts"} & set(given)
            if a.dest in given:
                value = given[a.dest]
            elif wanted and a.nargs != 0:
                value = self.value(a)
            else:
                continue
            argv += [value] if not a.option_strings else [a.option_strings[0], value]
        return argv


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")}
    env["EMARKET_OPENING_WORK"] = "0"
    return {**env, **extra}


def run(
    argv: list[str], env: dict[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )


def ended(
    argv: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str] | str:
    """Run ``argv`` as a person would: how it ended, or what is wrong if it did not in time."""
    try:
        return run(argv, env, timeout)
    except subprocess.TimeoutExpired:
        return f"{' '.join(argv)}: still running after {timeout:g} s"


def judged(argv: list[str], code: object, out: str, err: str) -> str | None:
    """What is wrong with how ``argv`` ended (None: a message, no traceback)."""
    if any(m in out + err for m in BUG_MARKS):
        return f"{' '.join(argv)}: exit {code}\n{(out + err)[-3000:]}"
    if code != 0 and not err.strip():
        return f"{' '.join(argv)}: exit {code} without a word"
    if len(err.splitlines()) > 8 and "usage:" not in err:  # argparse's usage is long
        return f"{' '.join(argv)}: {len(err.splitlines())} lines on stderr\n{err[-2000:]}"
    return None


class Hung(BaseException):
    """Raised (by SIGUSR1) in a command run in this process that overran its time."""


def run_here(argv: list[str], timeout: float) -> tuple[object, str, str] | str:
    """Run ``argv`` by :func:`main` in this process (a subprocess each would cost half a second
    of CPU per case): (exit code, stdout, stderr), or what is wrong (an exception escaping
    ``main``, the traceback a person would see; a wait beyond ``timeout``, ended by
    :class:`Hung` raised every second from then on). Log records go to its stderr as they
    would go to a person's terminal (``logging.lastResort``)."""
    out, err = io.StringIO(), io.StringIO()
    terminal = logging.StreamHandler(err)
    terminal.setLevel(logging.WARNING)
    done = threading.Event()

    def overran(*_: object) -> None:
        raise Hung

    def watchdog(main_thread: int) -> None:
        if not done.wait(timeout):
            while not done.wait(1.0):  # again, should the command swallow it
                signal.pthread_kill(main_thread, signal.SIGUSR1)

    before = signal.signal(signal.SIGUSR1, overran)
    threading.Thread(target=watchdog, args=(threading.get_ident(),), daemon=True).start()
    logging.getLogger().addHandler(terminal)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: object = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code
    except Hung:
        return f"{' '.join(argv)}: still running after {timeout:g} s"
    except BaseException:
        return f"{' '.join(argv)}: {traceback.format_exc()}"
    finally:
        done.set()
        logging.getLogger().removeHandler(terminal)
        signal.signal(signal.SIGUSR1, before)
    return code, out.getvalue(), err.getvalue()


def in_process(argv: list[str], timeout: float) -> str | None:
    """What is wrong with how ``argv`` ended, run by :func:`run_here` (None: nothing)."""
    r = run_here(argv, timeout)
    return r if isinstance(r, str) else judged(argv, *r)


def dead_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_line(argv: list[str], code: object, err: str, dead: str, source: str) -> str | None:
    """What is wrong with a command's report of the dead broker ``dead`` (None: nothing, or it
    did not need the broker): exit 4 and one line naming it and where it came from."""
    lines = err.strip().splitlines()
    if "the broker" in err and not (
        code == 4 and len(lines) == 1 and f"{dead} (from {source})" in lines[0]
    ):
        return f"{' '.join(argv)}: exit {code}, not one line naming {dead} from {source}: {lines}"
    return None


@pytest.mark.slow  # serve, worker and demo wait their --broker-wait (5 s), as a person's do
def test_no_command_shows_a_traceback_with_a_dead_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command with a dead broker in the environment (the README's `export
    EMARKET_BROKER=...` kept from an earlier session): a message and an exit, in time, and
    from those that need the broker, exit 4 and one line naming it and where its address came
    from. serve, worker and demo (which used to retry for half a minute and end in a
    traceback, serve after saying it serves) are run as a person would too, with the broker
    from the environment and from --broker, and must exit 4."""
    case = Case(tmp_path)
    dead = f"kafka://127.0.0.1:{dead_port()}"
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("EMARKET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EMARKET_BROKER", dead)
    monkeypatch.setenv("EMARKET_WORKER", "http://127.0.0.1:1")
    failures = []
    for command, parser in commands().items():
        argv = case.argv(command, parser, broker_wait="0")
        r = run_here(argv, STATED + SLACK)
        failures.append(r if isinstance(r, str) else judged(argv, *r))
        if not isinstance(r, str):
            failures.append(broker_line(argv, r[0], r[2], dead, "EMARKET_BROKER"))
    flag = ["--broker", dead]
    runs = [
        ([*case.argv((name,), commands()[(name,)]), *given], env, source)
        for name in ("serve", "worker", "demo")
        for given, env, source in (
            ([], clean_env(EMARKET_BROKER=dead), "EMARKET_BROKER"),
            (flag, clean_env(), "--broker"),
        )
    ]
    with ThreadPoolExecutor(len(runs)) as pool:  # they wait: --broker-wait, 5 s
        results = list(pool.map(lambda r: ended(r[0], r[1], STATED + SLACK), runs))
    for (argv, _, source), done in zip(runs, results, strict=True):
        if isinstance(done, str):
            failures.append(done)
            continue
        failures.append(judged(argv, done.returncode, done.stdout, done.stderr))
        failures.append(broker_line(argv, done.returncode, done.stderr, dead, source))
        if done.returncode != 4 or "is serving" in done.stdout:
            failures.append(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    assert not (found := [f for f in failures if f]), "\n\n".join(found)


def test_no_command_shows_a_traceback_with_a_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command, with each file it takes missing, a directory, bytes that are not text,
    or text that is not what the file should hold: a message and an exit, in time (a dead
    broker in the environment, for those that get that far)."""
    case = Case(tmp_path)
    for k in [k for k in os.environ if k.startswith("EMARKET_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("EMARKET_BROKER", f"kafka://127.0.0.1:{dead_port()}")
    monkeypatch.setenv("EMARKET_WORKER", "http://127.0.0.1:1")
    failures, file_options = [], 0
    for command, parser in commands().items():
        for a in options(parser):
            if not takes_file(a):
                continue
            file_options += 1
            for kind, content in (
                ("missing", None),
                ("dir", None),
                ("bytes", GARBAGE),
                ("text", TEXT),
            ):
                bad = tmp_path / f"{kind}-{file_options}"
                if kind == "dir":
                    bad.mkdir()
                elif content is not None:
                    bad.write_bytes(content)
                argv = case.argv(command, parser, **{a.dest: str(bad)})
                failures.append(in_process(argv, STATED + SLACK))
    assert file_options >= 15, "the walk found too few options that take a file"
    assert not (found := [f for f in failures if f]), "\n\n".join(found)


class Reads(dict[str, str]):
    """An ``os.environ`` that notes which ``EMARKET_*`` variables the code looks up."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env)
        self.read: set[str] = set()
        self.copied = False

    def _note(self, key: object) -> None:
        if isinstance(key, str) and key.startswith("EMARKET_"):
            self.read.add(key)

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:  # a copy, read later: every variable may be read
        self.copied = True
        return super().__iter__()

    def keys(self) -> Any:  # what dict(os.environ) and {**os.environ} call
        self.copied = True
        return super().keys()


def test_no_command_shows_a_traceback_in_a_garbled_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command with each ``EMARKET_*`` variable it reads, one at a time, set to something
    it is not (a number, a mechanism, a key, a URL...): a message and an exit. What each
    command reads is noted while it runs (a dead broker in the environment; a command that
    copies the environment may read any variable the source names), so a new variable, or a
    new command, is covered without a change here. The fault injections of the tests' workers
    (``streams/worker/faults.py``) are not for people."""
    case = Case(tmp_path)
    monkeypatch.chdir(tmp_path)  # a garbled EMARKET_DATA_DIR is made here, if anywhere
    env = Reads({k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")})
    env["EMARKET_BROKER"] = f"kafka://127.0.0.1:{dead_port()}"
    monkeypatch.setattr(os, "environ", env)
    pattern = r"EMARKET_[A-Z][A-Z_]*[A-Z]"
    named = {
        n for p in (ROOT / "streams").rglob("*.py") for n in re.findall(pattern, p.read_text())
    }
    faults = set(re.findall(pattern, (ROOT / "streams/worker/faults.py").read_text()))
    failures, seen = [], set()
    for command, parser in commands().items():
        argv = case.argv(command, parser, broker_wait="0")
        env.read.clear()
        env.copied = False
        failures.append(in_process(argv, STATED + SLACK))
        if failures[-1]:  # broken without a garbled variable: the dead broker test says more
            continue
        read = (env.read | (named if env.copied else set())) - faults - {"EMARKET_BROKER"}
        seen |= read
        for name in sorted(read):
            env[name] = "x%y"
            failures.append(in_process(argv, STATED + SLACK))
            del env[name]
    assert {"EMARKET_PARTITIONS", "EMARKET_NOISE_SECRET", "EMARKET_KAFKA_MECHANISM"} <= seen
    assert not (found := [f for f in failures if f]), "\n\n".join(found)


def test_options_work_on_either_side_of_the_command(tmp_path: Path) -> None:
    """`demo --broker kafka://host:9092` as the README writes it: every global option is
    taken after any command's name as before it."""
    case = Case(tmp_path)
    values = {"--broker": "kafka://h:9092", "--prefix": "p7", "--market-key": "K", "--json": None}
    flags = [x for k, v in values.items() for x in ([k] if v is None else [k, v])]
    parser = build_parser()
    for command, sub in commands().items():
        plain = case.argv(command, sub)
        for argv in ([*flags, *plain], [*plain, *flags]):
            args = parser.parse_args(argv)
            got = (args.broker, args.prefix, args.market_key, args.json)
            assert got == ("kafka://h:9092", "p7", "K", True), (argv, got)
        args = parser.parse_args(["--prefix", "before", *plain])  # not given after: kept
        assert args.prefix == "before", plain
    assert set(values) == set(GLOBAL_OPTIONS)


def test_every_option_has_a_help_line_with_its_default() -> None:
    missing, silent = [], []
    for command, parser in {(): build_parser(), **commands()}.items():
        for a in options(parser):
            text = a.help  # as --help prints it, before %-expansion
            name = f"{' '.join(command)} {'/'.join(a.option_strings) or a.dest}"
            if not text or text == argparse.SUPPRESS:
                missing.append(name)
            elif a.default not in (None, False, "", argparse.SUPPRESS) and "default" not in text:
                silent.append(f"{name} (default {a.default!r})")
    assert not missing, f"options without help: {missing}"
    assert not silent, f"defaults not shown: {silent}"
    usage = run(["buy", "--help"], clean_env()).stdout
    assert "(default 60.0)" in usage and "(default EUR)" in usage, usage


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    r = run(["--version"], clean_env())
    assert r.returncode == 0 and r.stdout.strip() == f"epsilon-market {version('epsilon-market')}"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_key_file_is_one_line(tmp_path: Path) -> None:
    case = Case(tmp_path)
    case.key.chmod(0)
    for command, parser in commands().items():
        if any(a.dest == "key_file" for a in options(parser)):
            r = run(case.argv(command, parser), clean_env(EMARKET_BROKER="kafka://127.0.0.1:1"))
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
            assert str(case.key) in r.stderr, r.stderr


# -- a live broker: Ctrl-C, and one serve per data directory ----------------------------------
def _connected(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds an established TCP connection to ``port`` on 127.0.0.1."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if m := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(m.group(1))
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[9] in inodes and f[3] == "01" and int(f[2].split(":")[1], 16) == port:
            return True
    return False


def _interrupt(
    proc: subprocess.Popen[str], ready: str, codes: tuple[int, ...] = (130,)
) -> str | None:
    """SIGINT to ``proc`` once it is ``ready`` (the caller waited for it), then what is wrong
    with how it ended (None: one of ``codes``, no traceback)."""
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return f"{proc.args!r}: still running 60 s after Ctrl-C ({ready})\n{err[-2000:]}"
    text = out + err
    # Killed by the SIGINT itself is how a shell's $? reads 130 too (Python ends so on an
    # unhandled Ctrl-C); it happens to a worker interrupted as its start ends (~1 in 36, on
    # the previous release as well), after it printed "interrupted": the same for a person.
    code = 130 if proc.returncode == -signal.SIGINT and 130 in codes else proc.returncode
    if any(m in text for m in BUG_MARKS) or code not in codes:
        return f"{proc.args!r} ({ready}): exit {proc.returncode}\n{text[-3000:]}"
    if code == 130 and not re.search("interrupted|stopped by Ctrl-C", text):
        return f"{proc.args!r} ({ready}): exit 130 without a word"
    return None


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "streams", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,  # a SIGINT to the test's group does not reach it
    )


def _wait_line(proc: subprocess.Popen[str], pattern: str, timeout: float = 120) -> str:
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"{proc.args!r}: no line matching {pattern!r}: {''.join(seen)}")


def _wait_connected(proc: subprocess.Popen[str], port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not _connected(proc.pid, port):
        assert proc.poll() is None, (proc.args, proc.communicate())
        assert time.monotonic() < deadline, f"{proc.args!r} never reached the broker"
        time.sleep(0.05)


def _wait_healthy(pages: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{pages}/health", timeout=10):
                return
        except OSError:
            assert time.monotonic() < deadline, f"serve's worker at {pages} never became healthy"
            time.sleep(0.2)


@pytest.mark.broker
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc to see who waits")
def test_ctrl_c_and_one_serve_per_data_directory(market: Market, tmp_path: Path) -> None:
    """Ctrl-C while each long-running command runs (waiting for a market that does not
    answer, or starting) ends it with exit 130, never a traceback; serve and worker, whose
    documented stop it is, may exit 0, and so do the --follow readers, which print what they
    read. While a serve runs on a data directory, a second serve or a worker on it is refused
    in one line naming its pid; once it stopped, the directory is free."""
    case = Case(tmp_path)
    broker, port = market.broker.url, int(market.broker.url.rsplit(":", 1)[1])
    env = clean_env(EMARKET_BROKER=broker, EMARKET_PREFIX=market.topics.prefix)
    data = tmp_path / "served"
    failures: list[str | None] = []

    serve = _start(
        ["serve", "--tansu", "--data-dir", str(data), "--web-port", str(find_free_port())], env
    )
    try:
        line = _wait_line(serve, r"worker pages: http://[\d.:]+/health")
        pages = line.split("worker pages: ")[1].split("/health")[0]
        for second in ("serve", "worker"):
            argv = [second, "--data-dir", str(data), "--web-port", str(find_free_port())]
            r = run(argv, env, timeout=60)
            assert r.returncode == 2 and "running on the data directory" in r.stderr, r.stderr
            assert f"pid {serve.pid}" in r.stderr and "Traceback" not in r.stderr
        # clients of this prefix wait for an answer the market gives only once its worker
        # is up: interrupted while they wait (connected to the broker)
        rows = tmp_path / "rows.jsonl"
        rows.write_text("[1.0]\n" * 5000)
        follow = (0,)  # Ctrl-C is how a --follow reader ends: it prints what it read
        waiting = {
            "tail": (["--follow"], follow),
            "sales": (["--follow"], follow),
            "rejections": (["--follow"], follow),
            "publish": (["--file", str(rows)], (130,)),
            "buy": ([], (130,)),
        }
        idle = ["--prefix", f"{market.topics.prefix}idle"]  # a market no worker serves
        for name, (extra, codes) in waiting.items():
            argv = [*case.argv((name,), commands()[(name,)], timeout="600"), *extra, *idle]
            proc = _start(argv, env)
            _wait_connected(proc, port)
            failures.append(_interrupt(proc, "connected to the broker", codes))
        worker = _start(
            [
                "worker",
                "--tansu",
                "--data-dir",
                str(tmp_path / "w"),
                "--web-port",
                str(find_free_port()),
                *idle,
            ],
            env,
        )
        _wait_line(worker, r"market key")
        failures.append(_interrupt(worker, "starting", (0, 130)))
        demo = _start(["demo", "--values", "3"], env)
        _wait_line(demo, r"worker starting")
        failures.append(_interrupt(demo, "its worker starting"))
        _wait_healthy(pages)
    finally:
        failures.append(_interrupt(serve, "serving", (0, 130)))
    assert not [f for f in failures if f], "\n\n".join(f for f in failures if f)
    try:
        with hold_data_dir(data, exclusive=True):
            pass
    except DataDirInUse as exc:
        raise AssertionError(f"serve left its data directory locked: {exc}") from None
