"""The Faust boundary, checked: the pins, the upstream code behind our patches, that nothing
else touches a library's internals, and issue #606.

``streams/worker/faust_internals.py`` replaces, wraps, copies, overrides or calls private
functions of faust-streaming, mode and aiokafka, and ``streams/broker/kafka_internals.py``
reads aiokafka's private client for the clients and the broker tools (their ``UPSTREAM``). An
upgrade could silently change what was copied, so each of those functions' source is hashed
here for the pinned version, and any difference fails with what to review. Nothing else in
``streams``, ``market`` or ``bench`` reads, writes, imports or overrides a library's private
name (:func:`test_only_the_boundary_modules_touch_library_internals`).

Issue #606 of faust-streaming (open at 0.15.3): Faust commits the first consecutive run of
acknowledged offsets after the committed one, and a record still in flight at the head of that
run is committed past (with ``concurrency > 1`` a later record is acknowledged first); after a
restart it is never processed. The tests below show it on the pinned Faust's real consumer, and
that the intake's acknowledgements cannot make it commit past a record not yet processed.

Re-recording after a reviewed upgrade: ``.venv/bin/python -m tests.test_faust_boundary``
prints the table of hashes for the installed versions.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import inspect
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka.structs import ConsumerRecord
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.broker import kafka_internals
from streams.worker import faust_internals
from streams.worker.faust_internals import (
    PINNED,
    UPSTREAM,
    Upstream,
    _deliver,
    install_batched_intake,
    install_takeover,
    install_tansu_compat,
    proving_assignor,
    skip_table_settle,
    source_sha256,
    tune_fetch_wait,
    worker_class,
)
from streams.worker.intake import InputEvent, Intake

ROOT = Path(__file__).resolve().parents[1]
BOUNDARY = (*UPSTREAM, *kafka_internals.UPSTREAM)
"""What the two boundary modules rely on, faust_internals' and kafka_internals'."""

RECORDED: dict[str, dict[str, str]] = {
    "faust-streaming==0.15.3": {
        "faust.stores.rocksdb:Store.partition_path": "0cc4eae7dc33fcf199f5a271d5186984f3a18af73a5168a9961e71518eb7ab14",
        "faust.stores.rocksdb:Store.revoke_partitions": "3f85447a24fc34ffd1ecb5039f502ac6049d92fbd61d91371049bab01203e390",
        "faust.tables.recovery:Recovery.on_rebalance": "aa4d997a1795ceae3880f98311b46935d9ae1a183a699b9a283bb4306bc8641f",
        "faust.tables.manager:TableManager.on_rebalance": "2d2c23a07bf5432854a01ad790af19bb7e7acc8062a6ac2934ff0db94bf3924a",
        "faust.tables.recovery:Recovery.on_recovery_completed": "6ef567acf072e46da3fccbccc6d662371f634f622c3d510972d5df81f70ae3ac",
        "faust.transport.consumer:Consumer.perform_seek": "0e8c130ff4b0afd82c0be9c5fd831316e10febc62c94032833911096e156d7c6",
        "faust.transport.consumer:Consumer.seek": "b86a9fe05f956b30cf299c787b6787c6e0349cbf1ae556f2456a1e97b15dbb22",
        "faust.transport.consumer:Consumer.pause_partitions": "27a1c94bdacd54de06593ec4eb040b32e9e7c9534e9af041f6ed66723df5f922",
        "faust.stores.rocksdb:Store._db_for_partition": "cb7e67d5f9efc4bced7b7ab09a55fe717c352daad5b693594e3f7ca52a98787f",
        "faust.stores.rocksdb:Store._get": "7ae8dfd6d7754a5952ae162d4d5cf0d51a8a020ed730a4a7c7dc7f7c84e73fb8",
        "faust.stores.rocksdb:Store._iterkeys": "12ecc1051cc5505d73fd9466067321c74f916abf110c66da03d6f858148b9479",
        "faust.stores.rocksdb:Store._visible_items": "545dc16a2b25e4a4c6ce4483ba808b7121b733ac32ecbdcbba78348248f816c2",
        "faust.stores.rocksdb:Store.set_persisted_offset": "b4c811926678346ebb8c40486dbc46d0fbac2bbeaa592384bd955112556acf45",
        "faust.transport.consumer:Consumer._drain_messages": "44a2500309e83c630493f6828af50166ec8d96a0b3e4fb2bab735f704ae93417",
        "faust.transport.consumer:Consumer.getmany": "4b168d84882a70d6e3e2f9804430a63b92f8fd117d3187cbb4aeb54305bda34e",
        "faust.transport.consumer:Consumer.track_message": "217d7f1399a4cd8e15a43a64ecf50413b9b738058e5433e057f0dc3927a3fc03",
        "faust.transport.consumer:Consumer._wait_next_records": "6218e1969a636b3ff504ad1b8e7ad58a113572e43d746cc96d684ed5153032c6",
        "faust.transport.consumer:Consumer._add_gap": "4df2573ded7c1c2cde04dc6bde6d4480cb5875ef565256e56966b585ae39b1c1",
        "faust.transport.consumer:Consumer._new_offset": "1d2c7ea89a7ad4f1a216c1d51936e569162cd66bd56f889e13fd29c910b58eb0",
        "faust.transport.consumer:Consumer._commit_offsets": "1a6979904118844111259d182ca1c6e92ccc16364ccbe55c58e59d6e254a7adb",
        "faust.transport.consumer:Consumer.ack": "5fcf41cf45153475de3790dc56fec1b83335956dc8b3bf7ff6bbb2b57627f03f",
        "faust.transport.drivers.aiokafka:Consumer._to_message": "7c24f6511b2fcef7cbfe73526e78de033bfe0df211f1fd30509d699c9deb6ce4",
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._create_worker_consumer": "c2701bfc3e6f6cad95c2be36d6a255a86e2c57d18d36cc1082b5fb5c482d99d7",
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._highwaters": "a7f4f97d9f32aca2777713e22671d70eae4b3ae51541bb09a90448ce83acefce",
        "faust.transport.drivers.aiokafka:Producer.on_start": "219c9a7a785d77b29016a7f32a12b29645eb9a84f4dd320eee420415eec54120",
        "faust.tables.manager:TableManager.on_start": "365dd25fbc0e068499c89e526516c638693a2d143b6ac249f84a60f5267fec9d",
        "faust.tables.table:Table.on_key_set": "a370e35ca55c2c7e36e93f0d4b485927c32d49199043cab2314572846184dd94",
        "faust.tables.table:Table.on_key_del": "4f2900b2f9d24a080d5cbc9eaa1f5566f1d11e56916e79b02f079c52f4751053",
        "faust.tables.base:Collection._on_changelog_sent": "60122c86a120d82cffa95da4c22323e12d67fa82f3112f08ac7f8edde7c47826",
        "faust.tables.base:Collection._new_changelog_topic": "77bea64b59f798094f8de7a939a2e159ae5cd55a0d1877728ef1e205fe7ef98c",
        "faust.stores.memory:Store._create_batch_iterator": "b082c8bcc040382347025bd5b08d31700b2e6b1d2c0232f1de551f1b5495d1ed",
        "faust.tables.base:Collection.apply_changelog_batch": "b980a78d3ae9b1e87f2d3fb63e0dcd2671341a1e60ea5233859d6bdd699d3029",
        "faust.stores.memory:Store.apply_changelog_batch": "71863e3cd727aac2001c4f19a393c637275eab36056c9a2d395ed1c7528e7647",
        "faust.stores.rocksdb:Store.apply_changelog_batch": "ea3344d369fc4ab5e3cdace30565691136035a463acb7b2551fdc0b8af71643b",
        "faust.tables.recovery:Recovery._restart_recovery.fun": "6bd8a8558a2dffe4c60b8150f23d721baa6b3d658367f911a3ad2187e20efc6f",
        "faust.tables.recovery:Recovery.flush_buffers": "6fa9c17f1071018c49cb6d411a34fb4a2c2ac4f41c3de650bbee15831abd6f1f",
        "faust.tables.recovery:Recovery._resume_streams": "d986a6710c1aca98f08c4c723fb3eadc5bf24576ad4eb9da3dd3eecedda2f24e",
        "faust.stores.memory:Store.on_recovery_completed": "a00bef343e139602606996e88809e62731a9113691ae678095266a52e0e0b013",
        "faust.streams:current_event": "3b821f1a78d86a58234dfe781fbf539775b00e66fdac9489c1c398a2d81d7e9d",
        "faust.serializers.codecs:Codec._dumps": "3efd56bca4bce2f97acb9ee82fb15a637f5b076240b0f6b5844cb2b6d1b1087b",
        "faust.serializers.codecs:Codec._loads": "02974d34db2ba5c794658ef84b0a615345e664ceee2a5e7a4a69b563a329dba6",
        "faust.serializers.codecs:Codec.dumps": "cf18c4ce2b00d8e67ad52630c1805a922dfd2995e9a2bd05fec49203327df43a",
        "faust.serializers.codecs:Codec.loads": "027828bc7440a51e764d3cfccd5741599d47e809bf6c74e446b483663ce444b0",
        "faust.worker:Worker._on_sigterm": "ba99cf23ea875c02ec56789188908e790bfa29ed6c8b7021e1ce939ade9c56b6",
        "faust.worker:Worker._on_sigint": "327193230c65ea83db83983b7a0a5f983e1658e3f4271a506838d96f507283f1",
        "faust.assignor.partition_assignor:PartitionAssignor.metadata": "6d7f0ebcd61e8b4d99aed38e57c4b47a68a868ed1be64c6e30f41ab665e740ae",
        "faust.assignor.partition_assignor:PartitionAssignor.assign": "25f1cbbba9d46748e0b1ccd1356277859176d8e1db9cb485fd38f15433f9b24e",
        "faust.assignor.partition_assignor:PartitionAssignor.on_assignment": "72f34bf053d696b51a6ec8c7f30ba5111800be760aa63dd28f6fcb5a29291f24",
        "faust.assignor.partition_assignor:PartitionAssignor._perform_assignment": "1e0bf2c5c8f42574670a8ef7661a043919c8e03b59ec966ce8109a36fd20fa52",
        "faust.assignor.partition_assignor:PartitionAssignor._protocol_assignments": "e231e876d04a222d3b2ff202dbcb2292184f33266d63bb5298b12309c88bc78d",
        "faust.assignor.partition_assignor:PartitionAssignor._compress": "de873849928dbd83c7b33c73c9fa60452bb0608a1f75ea6e7010c261dd297325",
        "faust.assignor.partition_assignor:PartitionAssignor._decompress": "d65b7310c43aebd78c1e7a92f9b2cacf80401821336b6e67d38cb7e6c90e6383",
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._ensure_consumer": "ff4a4c693b7ec63f4a76dfb61c419380bef70dd32383fe38ebcfcc27091605a6",
        "faust.transport.drivers.aiokafka:ConsumerRebalanceListener.on_partitions_assigned": "1c1f8406ad3698a6770a4ececb2f8074c0e80bea9ad0a0f4879baacb4ea996da",
    },
    "mode-streaming==0.7.1": {
        "mode.worker:Worker._on_sigterm": "6b99528ef557db1d6cedc52e50441fec873e6da0573b9a1c61801ad05c94c3a4",
        "mode.worker:Worker._on_sigint": "25334ac514b211b25e986626beba784aa5f31e31327f8fbc5b987c7230645f6c",
        "mode.worker:Worker._sentinel_task": "6e66058cf3e1b61606c66359bae30b81a5aeb355cf4f7e2cb4748449560c3687",
        "mode.utils.queues:FlowControlEvent.resume": "4dcdc1253fd0dcb40de18a3702503c01d21e9da7e5e55b122fb92615f27648d9",
        "mode.utils.queues:FlowControlEvent.clear": "dda5e40d80288a8f4244cffdf3e7a648773579a72e64b40182bbbc2424752524",
    },
    "aiokafka==0.14.0": {
        "aiokafka.client:AIOKafkaClient.add_topic": "b054eda662913f089f7620eb15d2151c81ecae4b95bc63daa7be19e876833325",
        "aiokafka.client:AIOKafkaClient.force_metadata_update": "cb7befef21c8f3f94ad4e1dbd5b36a962fe03f10517011041b9a631e3c46d6c8",
        "aiokafka.client:AIOKafkaClient.get_random_node": "0e2daf38b78e99a711cf0e929f623add6c5db734fdb65a403b83b55c1644b713",
        "aiokafka.client:AIOKafkaClient.send": "246b277687d7b687d79fd81f0a9718633b61a5ead0a1e9898419a1151ae3a91d",
        "aiokafka.consumer.group_coordinator:GroupCoordinator._maybe_leave_group": "016cd88a16e6c4b5b08ecab793e0fde0204fe2cfd836af5f682c48630d3fba2e",
        "aiokafka.consumer.consumer:AIOKafkaConsumer.start": "2f1ba70443327538800d348e61042cdedd5a5e6306f40ebe1a06dddba7494c45",
        "aiokafka.consumer.fetcher:Fetcher.__init__": "bf21ecb7e0f210b7c90ddabf89b02ae088d97d93cd157cea11429d13737eea2a",
        "aiokafka.consumer.group_coordinator:CoordinatorGroupRebalance.perform_group_join": "ff2c2109b2e9868dc23f43643160ea3d87c40093adc03e5e8c9a45c81844ea75",
        "aiokafka.consumer.group_coordinator:CoordinatorGroupRebalance._on_join_leader": "c57a3e85197dcc20a2b17c312a6750a383729059af9adacc9f0617e729b8e34d",
        "aiokafka.consumer.group_coordinator:GroupCoordinator._perform_assignment": "a5cf61fa973201996a1b81e3486e6928dd7bf3f9f8e0384a2fbd0085f774f125",
        "aiokafka.consumer.group_coordinator:GroupCoordinator._on_join_complete": "0b0b3d204b408f3ce3c3cc7d2168d6425e442c5a074b3f3193a897a510d80594",
        "aiokafka.consumer.consumer:AIOKafkaConsumer.__init__": "01506f316191f7c99c785bec915756d1560029a6fad75cba6f4da71e343a8163",
        "aiokafka.admin.client:AIOKafkaAdminClient.__init__": "2598ace9015c12b0dca13f0d2b35589c6a7a796a2e5bcb39a33fe2af6b1eafbe",
        "aiokafka.client:AIOKafkaClient.fetch_all_metadata": "8eeea5926b0ddbe252ea90f4cb7530fed30597c8275e9dbaac3e18b3cb235cd8",
    },
}

REVIEW = """
How to review and re-record (never just re-record):
  1. for each function listed, compare its new source with the old version's (e.g.
     `git diff` of the two releases' tags upstream, or `.venv/bin/python -c "import inspect,
     faust.transport.consumer as m; print(inspect.getsource(m.Consumer._drain_messages))"`);
  2. carry every change into streams/worker/faust_internals.py or
     streams/broker/kafka_internals.py (their UPSTREAM says which of our functions depends on
     each: a copy to update, a patch to check) and into the exact pins in pyproject.toml and
     streams/broker/upstream.PINNED;
  3. run the worker tests (tests/streams/worker/test_intake.py, test_recovery.py, test_chaos.py);
  4. `.venv/bin/python -m tests.test_faust_boundary` prints the hashes of the installed
     versions: replace RECORDED in tests/test_faust_boundary.py with them.
"""


def installed(dist: str) -> str:
    return importlib.metadata.version(dist)


def upstream_changes(
    entries: tuple[Upstream, ...],
    source_of: Callable[[Upstream], str],
    version_of: Callable[[str], str],
    recorded: dict[str, dict[str, str]],
) -> list[str]:
    """What differs from the recorded hashes: one line per upstream function."""
    problems = []
    for u in entries:
        release = f"{u.dist}=={version_of(u.dist)}"
        table = recorded.get(release)
        if table is None:
            problems.append(
                f"{u.target}: no hashes recorded for {release} (pinned "
                f"{u.dist}=={PINNED[u.dist]}); {u.use} by {u.by}"
            )
        elif u.target not in table:
            problems.append(f"{u.target}: no hash recorded for {release}; {u.use} by {u.by}")
        elif table[u.target] != source_sha256(source_of(u)):
            problems.append(f"{u.target}: its source changed in {release}; {u.use} by {u.by}")
    return problems


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for req in project["optional-dependencies"]["service"]:
        name, sep, version = req.partition("==")
        if sep:
            pins[name.strip()] = version.strip()
    return pins


def test_the_patched_libraries_are_pinned_to_the_reviewed_versions() -> None:
    pins = _pyproject_pins()
    for dist, version in PINNED.items():
        assert pins.get(dist) == version, (
            f"pyproject.toml pins {dist}=={pins.get(dist)} but streams.broker.upstream.PINNED says "
            f"{version}: they must agree\n{REVIEW}"
        )
        assert installed(dist) == version, (
            f"{dist} {installed(dist)} is installed, but the boundary modules were reviewed "
            f"against {version}\n{REVIEW}"
        )


def test_no_upstream_function_behind_the_boundary_changed() -> None:
    problems = upstream_changes(BOUNDARY, Upstream.source, installed, RECORDED)
    assert not problems, "\n".join(problems) + "\n" + REVIEW


def test_the_recorded_hashes_name_only_what_the_boundary_uses() -> None:
    targets = {u.target for u in BOUNDARY}
    stale = [t for release in RECORDED.values() for t in release if t not in targets]
    assert not stale, stale


def test_a_changed_upstream_source_is_caught() -> None:
    drain = next(u for u in UPSTREAM if u.qualname == "Consumer._drain_messages")
    original = drain.source()
    assert "yield_every = 100" in original

    def tampered(u: Upstream) -> str:
        return (
            original.replace("yield_every = 100", "yield_every = 1000")
            if u is drain
            else u.source()
        )

    assert source_sha256(tampered(drain)) != source_sha256(original)
    assert upstream_changes(UPSTREAM, tampered, installed, RECORDED) == [
        f"{drain.target}: its source changed in faust-streaming==0.15.3; copied by _drain_batches"
    ]


def test_another_installed_version_is_caught() -> None:
    def newer(dist: str) -> str:
        return "0.16.0" if dist == "faust-streaming" else installed(dist)

    problems = upstream_changes(BOUNDARY, Upstream.source, newer, RECORDED)
    assert len(problems) == sum(u.dist == "faust-streaming" for u in BOUNDARY)
    assert all("no hashes recorded for faust-streaming==0.16.0" in p for p in problems)


@pytest.fixture
def every_patch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every patch of faust_internals installed, and everything put back afterwards."""
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from faust.tables.manager import TableManager
    from faust.tables.recovery import Recovery
    from faust.transport.consumer import Consumer
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    for owner, name in (
        (AIOKafkaConsumerThread, "_create_worker_consumer"),
        (AIOKafkaConsumerThread, "_highwaters"),
        (GroupCoordinator, "_maybe_leave_group"),
        (TableManager, "on_start"),
        (Consumer, "_drain_messages"),
        (Consumer, "perform_seek"),
        (Consumer, "_commit_offsets"),
        (TableManager, "on_rebalance"),
        (Recovery, "on_recovery_completed"),
        (Recovery, "_resume_streams"),
        (faust_internals, "_tansu_installed"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(faust_internals, "_tansu_installed", False)
    install_batched_intake()
    tune_fetch_wait(15)
    skip_table_settle()
    install_tansu_compat()
    install_takeover()
    yield


def _patched_upstream_attributes() -> set[str]:
    """Every attribute of an upstream class that holds a function of faust_internals."""
    found = set()
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in ("faust", "mode", "aiokafka"):
            continue
        for cls in list(vars(module).values()):
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            for attr, value in vars(cls).items():
                if getattr(value, "__module__", None) == faust_internals.__name__:
                    found.add(f"{name}:{cls.__qualname__}.{attr}")
    return found


def test_every_patch_has_a_recorded_hash(every_patch: None) -> None:
    targets = {u.target for u in UPSTREAM}
    patched = _patched_upstream_attributes()
    # the drain loop, the consumer, tables, two for Tansu, five for the takeover
    assert len(patched) == 10, patched
    assert patched <= targets, patched - targets
    # the hashes are of the upstream code, not of our replacements
    drain = next(u for u in UPSTREAM if u.qualname == "Consumer._drain_messages")
    assert "yield_every = 100" in drain.source()
    assert not upstream_changes(UPSTREAM, Upstream.source, installed, RECORDED)


def test_every_private_method_the_boundary_overrides_has_a_recorded_hash() -> None:
    targets = {u.target for u in UPSTREAM}
    classes = [worker_class(lambda: None), proving_assignor(None)]
    classes += [
        c
        for c in vars(faust_internals).values()
        if inspect.isclass(c) and c.__module__ == faust_internals.__name__
    ]
    overridden = set()
    for cls in classes:
        for attr, value in vars(cls).items():
            if inspect.isfunction(value) and attr.startswith("_") and not attr.startswith("__"):
                for base in cls.__mro__[1:]:
                    if attr in vars(base):
                        overridden.add(f"{base.__module__}:{base.__qualname__}.{attr}")
    assert overridden == {
        "mode.worker:Worker._on_sigterm",
        "mode.worker:Worker._on_sigint",
        "faust.worker:Worker._on_sigterm",
        "faust.worker:Worker._on_sigint",
        "mode.worker:Worker._sentinel_task",
        "faust.serializers.codecs:Codec._dumps",
        "faust.serializers.codecs:Codec._loads",
    }
    assert overridden <= targets


SCANNED = ("streams", "market", "bench")
FIRST_PARTY = (*SCANNED, "tests")
BOUNDARY_MODULES = (
    ROOT / "streams" / "worker" / "faust_internals.py",
    ROOT / "streams" / "broker" / "kafka_internals.py",
)
STANDARD_LIBRARY = {
    "_exit": "os._exit, documented",
    "_replace": "a named tuple's, documented (as _asdict, _fields, _make)",
    "_asdict": "a named tuple's, documented",
    "_fields": "a named tuple's, documented",
    "_make": "a named tuple's, documented",
    "_actions": "argparse: a parser's options, whose defaults the CLI sets from the environment",
}
"""Private names of the standard library the tree may read (not a third party's: pinned with
Python itself), each with where it is read. Imports of the standard library's private modules
(``_hashlib``, for a type) are not reported either."""
PROBES = ("getattr", "setattr", "hasattr", "delattr")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _tree() -> list[Path]:
    return [path for d in SCANNED for path in sorted((ROOT / d).rglob("*.py"))]


def _own_private_names(paths: list[Path]) -> set[str]:
    """Private names the tree defines: its functions, classes, variables, class attributes and
    fields, and the attributes it sets on ``self`` or ``cls``. A private name read anywhere that
    is not among them can only be a library's."""
    own: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[0])
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
    return {name for name in own if _private(name)}


def _library_private_accesses(source: str, where: str, own: set[str]) -> list[str]:
    """Private names of a library that ``source`` reads, writes or imports: an attribute (of any
    object, ``self`` included: a subclass reading its library base's) or a ``getattr``-style
    probe whose name the tree does not define (nor :data:`STANDARD_LIBRARY` lists), or an
    import of a private name or module of a third-party package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        at = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if node.attr not in own and node.attr not in STANDARD_LIBRARY:
                found.append(f"{at} {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in (*FIRST_PARTY, *sys.stdlib_module_names):
                parts = [*node.module.split("."), *(a.name for a in node.names)]
                if any(_private(part) for part in parts):
                    found.append(f"{at} {ast.unparse(node)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                outside = parts[0] not in (*FIRST_PARTY, *sys.stdlib_module_names)
                if outside and any(_private(part) for part in parts):
                    found.append(f"{at} import {alias.name}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in PROBES
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and _private(str(node.args[1].value))
            and str(node.args[1].value) not in own
        ):
            found.append(f"{at} {ast.unparse(node)}")
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _class_private_names(tree: ast.Module) -> dict[str, tuple[int, set[str]]]:
    """Module-level classes with bases (and classes in their bodies), by qualified name: their
    line and the private names their bodies define (methods, attributes)."""
    out: dict[str, tuple[int, set[str]]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, ast.ClassDef):
                continue
            qualname = prefix + node.name
            names = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.Assign):
                    names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
            names = {n for n in names if _private(n)}
            if node.bases and names:
                out[qualname] = (node.lineno, names)
            visit(node.body, qualname + ".")

    visit(tree.body, "")
    return out


def _library_private_overrides(paths: list[Path]) -> list[str]:
    """Private methods and attributes of a library's class that a class of the tree overrides
    (its own class or any of its bases is a library's), found on the imported classes."""
    found = []
    for path in paths:
        classes = _class_private_names(ast.parse(path.read_text()))
        if not classes or path.name == "__main__.py":
            continue
        module = importlib.import_module(_module_name(path))
        for qualname, (line, names) in classes.items():
            cls: Any = module
            for part in qualname.split("."):
                cls = getattr(cls, part)
            for base in cls.__mro__[1:]:
                if base is object or base.__module__.split(".")[0] in FIRST_PARTY:
                    continue
                found += [
                    f"{path.relative_to(ROOT)}:{line} {qualname}.{name} overrides "
                    f"{base.__module__}.{base.__qualname__}.{name}"
                    for name in sorted(names & set(vars(base)))
                ]
    return found


def test_only_the_boundary_modules_touch_library_internals() -> None:
    """Outside faust_internals and kafka_internals, ``streams``, ``market`` and ``bench`` call
    named functions of those two instead of a library's private names: a private name read,
    written, imported, probed or overridden anywhere else is reported with its line."""
    paths = [path for path in _tree() if path not in BOUNDARY_MODULES]
    own = _own_private_names(paths)
    found = [
        hit
        for path in paths
        for hit in _library_private_accesses(path.read_text(), str(path.relative_to(ROOT)), own)
    ]
    found += _library_private_overrides(paths)
    assert not found, found
    for boundary in BOUNDARY_MODULES:  # and the scan does find theirs
        assert _library_private_accesses(boundary.read_text(), boundary.name, own), boundary


def test_the_scan_tells_a_library_private_from_the_tree_own() -> None:
    own = _own_private_names(_tree())
    assert "_exact" in own  # market.release_state's
    source = """
import aiokafka._internal
from aiokafka.util import _private_helper
async def f(self, state, consumer):
    state._exact = consumer._client
    await self._consumer._client.fetch_all_metadata()
    os._exit(getattr(consumer, "_coordinator", None) and hasattr(state, "_exact"))
"""
    hits = [h.split(" ", 1)[1] for h in _library_private_accesses(source, "s", own)]
    assert sorted(hits) == sorted(
        [
            "import aiokafka._internal",
            "from aiokafka.util import _private_helper",
            "consumer._client",
            "self._consumer._client",
            "getattr(consumer, '_coordinator', None)",
        ]
    )
    # an override of a library's private method, found on the imported class's bases
    overrides = _library_private_overrides([BOUNDARY_MODULES[0]])
    assert any(
        "_Codec._dumps overrides faust.serializers.codecs.Codec._dumps" in h for h in overrides
    )


# --- faust-streaming #606 -------------------------------------------------------------------

TOPIC = "t.values"


class _Consumer:
    """A real Faust app's consumer, not started: the broker's side of a commit is recorded.

    Everything that decides *what* to commit is Faust's own code (``ack``, ``commit``,
    ``_new_offset``, ``_commit_offsets``); only the group's assignment and the OffsetCommit
    request itself, which need a broker, are answered here.
    """

    def __init__(self, partitions: int) -> None:
        self.app = faust.App("test-606", broker="kafka://127.0.0.1:9", web_enabled=False)
        self.app.flow_control.resume()
        self.app.topics.acking_topics.add(TOPIC)
        consumer = self.faust = self.app.consumer
        tps = {TP(TOPIC, p) for p in range(partitions)}
        consumer.flow_active = True
        consumer.assignment = lambda: tps
        consumer.highwater = lambda tp: 0  # monitoring only
        self.committed: dict[TP, int] = {}

        async def offset_commit(offsets: dict[TP, int]) -> bool:
            self.committed.update(offsets)
            return True

        async def nothing_to_flush() -> None:
            return None

        consumer._commit = offset_commit
        self.app.producer.flush = nothing_to_flush

    async def commit(self) -> dict[TP, int]:
        await self.faust.commit()
        return dict(self.committed)

    def close(self) -> None:
        self.app._consumer._thread.thread_loop.close()


@pytest.fixture
def consumers() -> Iterator[Callable[[int], _Consumer]]:
    made: list[_Consumer] = []

    def make(partitions: int) -> _Consumer:
        made.append(_Consumer(partitions))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _fetch(counts: dict[int, int], start: int = 0) -> dict[TP, list[Any]]:
    """One fetch: ``counts[p]`` records of partition ``p`` from offset ``start``."""

    def record(p: int, o: int) -> Any:
        return ConsumerRecord(TOPIC, p, o, 0, 0, b"k", b"v", None, 1, 1, [])

    return {
        TP(TOPIC, p): [record(p, o) for o in range(start, start + n)] for p, n in counts.items()
    }


def test_the_pinned_faust_commits_past_a_record_in_flight(
    consumers: Callable[[int], _Consumer],
) -> None:
    """#606 on the real consumer: offset 0 still in flight, 1-3 acknowledged, 4 committed."""

    async def run() -> dict[TP, int]:
        c = consumers(1)
        intake = Intake(c.app, {TOPIC})
        await _deliver(c.faust, _fetch({0: 4}), None, intake)
        messages = [ev.message for ev in await intake.take(10)]
        for m in messages[1:]:  # what concurrency > 1 does: later records finish first
            c.faust.ack(m)
        return await c.commit()

    assert asyncio.run(run()) == {TP(TOPIC, 0): 4}, (
        "Faust no longer commits past an in-flight record: #606 may be fixed upstream; "
        "review Consumer._new_offset and the intake's ordering of acknowledgements"
    )


def test_the_intake_never_commits_past_a_record_not_yet_processed(
    consumers: Callable[[int], _Consumer],
) -> None:
    """Two partitions, two batches taken; the later batch is acknowledged first: nothing is
    committed past the earlier batch's records until they are acknowledged too."""

    async def run() -> list[dict[TP, int]]:
        c = consumers(2)
        intake = Intake(c.app, {TOPIC})
        await _deliver(c.faust, _fetch({0: 4, 1: 4}), None, intake)
        first = await intake.take(4)  # round robin: offsets 0-1 of both partitions
        second = await intake.take(4)  # offsets 2-3 of both
        commits = [await c.commit()]
        intake.ack(second)  # processed first (as with concurrency > 1)
        commits.append(await c.commit())
        intake.ack([ev for ev in first if ev.message.offset == 1])  # of both partitions
        commits.append(await c.commit())
        intake.ack([ev for ev in first if ev.message.offset == 0])  # now all are processed
        commits.append(await c.commit())
        return commits

    p0, p1 = TP(TOPIC, 0), TP(TOPIC, 1)
    assert asyncio.run(run()) == [{}, {}, {}, {p0: 4, p1: 4}]


def test_a_fetch_is_taken_round_robin_over_partitions(
    consumers: Callable[[int], _Consumer],
) -> None:
    """Faust's scheduler, kept by the copied drain loop: a batch smaller than a fetch takes from
    every partition, not the whole of the first."""

    async def run() -> list[tuple[int, int]]:
        c = consumers(3)
        intake = Intake(c.app, {TOPIC})
        await _deliver(c.faust, _fetch({0: 5, 1: 5, 2: 5}), None, intake)
        return [(ev.message.partition, ev.message.offset) for ev in await intake.take(6)]

    assert asyncio.run(run()) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


def test_a_large_fetch_yields_to_the_event_loop(consumers: Callable[[int], _Consumer]) -> None:
    """Faust's yield every 100 records, kept: a timer runs while a fetch is converted."""

    async def run() -> int:
        c = consumers(1)
        intake = Intake(c.app, {TOPIC})
        ticks = 0

        async def timer() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(timer())
        await asyncio.sleep(0)
        before = ticks
        await _deliver(c.faust, _fetch({0: 450}), None, intake)
        task.cancel()
        return ticks - before

    assert asyncio.run(run()) >= 4  # 450 records: four yields


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_no_order_of_acknowledgements_commits_past_an_unprocessed_record(data: Any) -> None:
    counts = data.draw(st.dictionaries(st.integers(0, 2), st.integers(1, 8), min_size=1))

    async def run() -> None:
        c = _Consumer(3)  # made in the loop: its consumer's queues belong to it
        try:
            await _acknowledge_in_any_order(c, counts, data)
        finally:
            c.close()

    asyncio.run(run())


async def _acknowledge_in_any_order(c: _Consumer, counts: dict[int, int], data: Any) -> None:
    """Take the fetch in batches of any size, acknowledge any of the taken records in any
    order, commit after each: the committed offset of a partition never passes its earliest
    record not acknowledged; once all are, everything is committed."""
    intake = Intake(c.app, {TOPIC})
    await _deliver(c.faust, _fetch(counts), None, intake)
    unacked: list[InputEvent] = []
    processed: dict[int, set[int]] = {p: set() for p in counts}
    while intake.pending() or unacked:
        if intake.pending() and (not unacked or data.draw(st.booleans())):
            unacked += await intake.take(data.draw(st.integers(1, 5)))
        picked = data.draw(st.lists(st.sampled_from(unacked), min_size=1, unique=True))
        intake.ack(picked)
        for ev in picked:
            processed[ev.message.partition].add(ev.message.offset)
        unacked = [ev for ev in unacked if ev not in picked]
        for tp, offset in (await c.commit()).items():
            earliest = min(
                set(range(counts[tp.partition])) - processed[tp.partition],
                default=counts[tp.partition],
            )
            assert offset <= earliest, (tp, offset, earliest)
    assert await c.commit() == {TP(TOPIC, p): n for p, n in counts.items()}


if __name__ == "__main__":
    from collections import defaultdict

    table: dict[str, dict[str, str]] = defaultdict(dict)
    for u in BOUNDARY:
        table[f"{u.dist}=={installed(u.dist)}"][u.target] = source_sha256(u.source())
    for release, hashes in table.items():
        print(f'    "{release}": {{')
        for target, digest in hashes.items():
            print(f'        "{target}":\n            "{digest}",')
        print("    },")
