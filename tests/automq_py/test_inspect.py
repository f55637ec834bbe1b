"""``automq-py inspect`` on an object file: seed-000 lines, records, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from automq_py.log import meta_stream_record
from automq_py.log.meta_stream_record import LeaderEpochCheckpoint, MetaKeyValue
from storage.object_writer import ObjectWriter
from storage.stream_record_batch import StreamRecordBatch
from tests.protocol.test_record_batch import make_batch


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "automq_py", *args], capture_output=True, text=True, timeout=60
    )


def write_object(path: Path) -> None:
    log_meta = {"streamMap": {"log": 4, "tim": 5, "txn": -1}, "segmentMetas": []}
    meta = [
        MetaKeyValue("PARTITION", b'{"s":0,"c":0,"r":0,"cs":false}'),
        MetaKeyValue("LOG", json.dumps(log_meta).encode()),
        MetaKeyValue("LEADER_EPOCH_CHECKPOINT", LeaderEpochCheckpoint(0, ((0, 0),)).encode()),
    ]
    writer = ObjectWriter(block_size=1 << 20)
    for i, kv in enumerate(meta):
        writer.add(StreamRecordBatch(3, 0, i, 1, meta_stream_record.encode(kv)))
    writer.add(StreamRecordBatch(4, 0, 55400, 15, make_batch(55400)))
    path.write_bytes(writer.finish().to_bytes())


def test_inspect_prints_footer_index_ranges_and_records(tmp_path: Path) -> None:
    obj = tmp_path / "78"
    write_object(obj)
    out = run_cli("inspect", str(obj), "--records")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("indexStartPosition: ")
    assert lines[1] == "indexBlockLength: 72"
    assert lines[2].startswith("streamId=3, startOffset=0, endOffset=3, recordCount=3, ")
    assert lines[3].startswith("streamId=4, startOffset=55400, endOffset=55415, recordCount=1, ")
    assert lines[4] == "objectId=78, ranges=[3:0-3, 4:55400-55415, ]"
    text = out.stdout
    assert 'key=PARTITION, value={"s":0,"c":0,"r":0,"cs":false}' in text
    assert '"streamMap": {"log": 4' in text
    assert "EpochEntry(epoch=0, startOffset=0)" in text
    assert "StreamRecordBatch{streamId=4, epoch=0, baseOffset=55400, count=15" in text
    assert "baseOffset=55400, maxTimestamp=1712451146370, timestampType=CREATE_TIME" in text
    assert "lastSequence=5414, compressionType=NONE" in text


def test_inspect_reports_truncated_object_without_a_traceback(tmp_path: Path) -> None:
    obj = tmp_path / "5"
    write_object(obj)
    obj.write_bytes(obj.read_bytes()[:-10])
    out = run_cli("inspect", str(obj))
    assert out.returncode == 2
    assert "footer" in out.stderr and "Traceback" not in out.stderr


def test_inspect_help() -> None:
    out = run_cli("inspect", "--help")
    assert out.returncode == 0 and "--records" in out.stdout
