"""A source on object storage (TOKENMILL_SOURCE=s3://bucket/prefix/), against the real S3 server on loopback: every
format read as from a local copy of the same files, listing retried through throttling, an object gone between
listing and reading rejected by name, new objects as new batches and changed ones refused, and the credentials in
none of what a run writes or says."""

from __future__ import annotations

import http.client
import http.server
import io
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from tests.stages.raw.test_warc_lengths import lie, pages
from tests.stages.raw.test_warc_lengths import write as write_layout
from tests.stages.raw.test_web_readers import crawl, multilingual_pages, write_warc
from tokenmill.batches import read_registry, register_new_files
from tokenmill.common.io import REJECTED_FILE, iter_jsonl, record_shards, zstd
from tokenmill.common.remote import RETRIES, RemoteLocation
from tokenmill.errors import SourceError
from tokenmill.stages.raw import RawSettings, ingest
from tokenmill.stages.raw.discover import list_source, source_state
from tokenmill.stages.raw.ingest import IngestTask, ingest_task

PREFIX = "corpus/"


def mixed_corpus(folder: Path) -> None:
    """One file of every format, a nested folder, an empty file, a README (skipped), a hidden file (left out) and
    WARC records whose Content-Length lies (plain and one gzip member each: checked by ranged reads of the object)."""
    (folder / "nested" / "deeper").mkdir(parents=True)
    (folder / ".hidden").mkdir()
    lines = [json.dumps({"text": f"line {i} of the articles", "lang": "en"}) for i in range(5)]
    (folder / "articles.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "nested" / "forum.jsonl.zst").write_bytes(zstd.compress(("\n".join(lines[:3]) + "\nnot json\n").encode()))
    (folder / "nested" / "deeper" / "poem.txt").write_text("A short poem\nin two lines\n")
    (folder / "table.csv").write_text("text,author\nfirst row,a\nsecond row,b\n")
    table = pa.table({"text": [f"parquet row {i}" for i in range(50)], "n": list(range(50))})
    pq.write_table(table, folder / "rows.parquet", row_group_size=7)  # several row groups, each a ranged read
    write_warc(folder / "nested" / "crawl.warc.gz", crawl(multilingual_pages()))
    for layout, name, liar, delta in (("plain", "liar.warc", 2, 7), ("members", "nested/liar.warc.gz", 3, -5)):
        records = pages()
        records[liar] = lie(records[liar], delta)
        write_layout(folder / name, records, layout)
    (folder / "empty.jsonl").write_bytes(b"")
    (folder / "README.md").write_text("not a corpus file\n")
    (folder / ".hidden" / "secret.jsonl").write_text('{"text": "never read"}\n')


def upload(s3, bucket: str, folder: Path) -> None:
    client = s3.client()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.put_object(Bucket=bucket, Key=PREFIX + path.relative_to(folder).as_posix(), Body=path.read_bytes())


@pytest.fixture
def fresh_clients(s3_env) -> Iterator[None]:
    """s3fs keeps one filesystem per set of arguments: one made with another test's variables must not answer."""
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def records(folder: Path) -> list[dict]:
    return [r for shard in record_shards(folder) for r in iter_jsonl(shard)]


def comparable(entry: dict, url: str) -> dict:
    """A record or rejected entry with the source's location taken out of its path and id."""
    entry = {k: v for k, v in entry.items() if k != "id"}
    if "source" in entry:
        entry["source"] = {**entry["source"], "path": entry["source"]["path"].removeprefix(url)}
    else:
        entry["path"] = entry["path"].removeprefix(url)
    return entry


def test_a_prefix_of_mixed_formats_reads_as_its_local_copy(s3, fresh_clients, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    mixed_corpus(local)
    bucket = s3.make_bucket("mixed-formats")
    upload(s3, bucket, local)
    url = f"s3://{bucket}/{PREFIX}"

    remote = ingest(url, tmp_path / "remote-out", workers=2)
    mirror = ingest(local, tmp_path / "local-out", workers=2)

    got, want = records(tmp_path / "remote-out"), records(tmp_path / "local-out")
    assert [comparable(r, url) for r in got] == [comparable(r, "") for r in want]
    assert {r["source"]["path"] for r in got} == {url + f["path"] for f in mirror.files if f["records"]}
    assert all(r["source"]["path"].startswith(url) for r in got)
    rejected = list(iter_jsonl(tmp_path / "remote-out" / REJECTED_FILE))
    local_rejected = list(iter_jsonl(tmp_path / "local-out" / REJECTED_FILE))
    assert [comparable(r, url) for r in rejected] == [comparable(r, "") for r in local_rejected]
    assert remote.docs_in == mirror.docs_in and remote.docs_out == mirror.docs_out
    assert remote.rejected_by_reason == mirror.rejected_by_reason == {"malformed_json": 1, "warc_length_mismatch": 2}
    assert remote.files_read == mirror.files_read == 9  # README skipped, the hidden folder left out
    assert remote.skipped_files == [url + "README.md"]
    assert remote.bytes_read == mirror.bytes_read
    assert remote.source == url and remote.remote_retries == 0


class ThrottlingProxy(http.server.ThreadingHTTPServer):
    """An S3 endpoint on loopback that answers `503 SlowDown` to the first request of each kind it is told to
    throttle, and forwards everything else to the real server (the Host header kept: it is signed)."""

    def __init__(self, upstream: str, throttle: dict[str, int]):
        self.upstream = upstream.removeprefix("http://")
        self.throttle = dict(throttle)  # "LIST" / "GET" / "HEAD" -> how many of them to refuse
        self.refused: list[str] = []
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: ThrottlingProxy
    protocol_version = "HTTP/1.1"

    def _kind(self) -> str:
        if self.command == "GET" and ("list-type=" in self.path or self.path.rstrip("/").count("/") <= 1):
            return "LIST"
        return self.command

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        kind = self._kind()
        if self.server.throttle.get(kind, 0) > 0:
            self.server.throttle[kind] -= 1
            self.server.refused.append(f"{kind} {self.path}")
            message = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(0 if self.command == "HEAD" else len(message)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(message)
            return
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=30)
        upstream.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in {"transfer-encoding", "connection", "content-length"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    def log_message(self, format, *args) -> None:  # quiet: pytest shows what a test prints
        pass


@pytest.fixture
def throttled(s3, fresh_clients, monkeypatch, request) -> Iterator[ThrottlingProxy]:
    """The proxy in front of the server, refusing one LIST, one HEAD and one GET (or `request.param`'s counts)."""
    proxy = ThrottlingProxy(s3.endpoint, getattr(request, "param", {"LIST": 1, "GET": 1, "HEAD": 1}))
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    yield proxy
    proxy.shutdown()
    proxy.server_close()


def test_throttled_requests_are_retried_and_counted(s3, throttled, tmp_path):
    bucket = s3.make_bucket("throttled")
    client = s3.client()
    lines = "".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(20))
    client.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=lines.encode())
    client.put_object(Bucket=bucket, Key="corpus/sub/b.jsonl", Body=lines.encode())
    url = f"s3://{bucket}/corpus/"

    result = ingest(url, tmp_path / "out", RawSettings(), workers=1)

    assert result.docs_out == 40 and result.rejected == 0
    assert sorted(kind.split()[0] for kind in throttled.refused) == ["GET", "HEAD", "LIST"]
    assert result.remote_retries == 3 and result.remote_retry_wait_s > 0
    timings = json.loads((tmp_path / "out" / "_timings.json").read_text())
    assert timings["remote_retries"] == 3
    assert "remote_retries" not in json.loads((tmp_path / "out" / "_stats.json").read_text())  # a run fact


def test_an_object_deleted_between_listing_and_reading_is_one_rejected_line(s3, fresh_clients, tmp_path):
    bucket = s3.make_bucket("deleted-object")
    client = s3.client()
    for name in ("a.jsonl", "gone.jsonl", "z.jsonl"):
        client.put_object(Bucket=bucket, Key=f"corpus/{name}", Body=b'{"text": "kept"}\n')
    url = f"s3://{bucket}/corpus/"
    listed = list_source(RemoteLocation(url)).files
    client.delete_object(Bucket=bucket, Key="corpus/gone.jsonl")

    done = ingest_task(IngestTask(files=listed, folder=str(tmp_path / "task"), settings=RawSettings()))

    assert [f.records for f in done.files] == [1, 0, 1]
    (entry,) = iter_jsonl(tmp_path / "task" / REJECTED_FILE)
    assert entry["path"] == url + "gone.jsonl" and entry["reason"] == "unreadable_file"
    assert entry["detail"] == f"FileNotFoundError: {url}gone.jsonl: no such object (removed since it was listed?)"


def test_new_objects_come_in_as_new_batches_and_changed_ones_wait(s3, fresh_clients, tmp_path):
    bucket = s3.make_bucket("incremental")
    client = s3.client()
    client.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=b'{"text": "first"}\n')
    client.put_object(Bucket=bucket, Key="corpus/sub/b.jsonl", Body=b'{"text": "second"}\n')
    source, data = RemoteLocation(f"s3://{bucket}/corpus/"), tmp_path / "data"
    url = source.url

    assert register_new_files(data, source, source_state(source))[0] == "g1-b000001"
    first = read_registry(data).batch("g1-b000001")
    assert sorted(first.files) == [url + "a.jsonl", url + "sub/b.jsonl"]
    assert all(len(entry) == 2 and isinstance(entry[1], str) for entry in first.files.values())  # size, ETag

    # the same bytes written again: the same ETag, nothing new
    client.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=b'{"text": "first"}\n')
    assert register_new_files(data, source, source_state(source))[0] is None

    client.put_object(Bucket=bucket, Key="corpus/sub/c.jsonl", Body=b'{"text": "third"}\n')
    key, changes = register_new_files(data, source, source_state(source))
    assert key == "g1-b000002" and sorted(read_registry(data).batch(key).files) == [url + "sub/c.jsonl"]
    result = ingest(source, tmp_path / "raw", only=read_registry(data).batch(key).files)
    assert [r["text"] for r in records(tmp_path / "raw")] == ["third"]
    assert [r["source"] for r in records(tmp_path / "raw")] == [{"path": url + "sub/c.jsonl", "line": 1}]
    assert result.files_read == 1

    # same size, other bytes: a new ETag, so changed content, which waits for a rebuild
    client.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=b'{"text": "FIRST"}\n')
    client.put_object(Bucket=bucket, Key="corpus/d.jsonl", Body=b'{"text": "fourth"}\n')
    key, changes = register_new_files(data, source, source_state(source))
    assert key == "g1-b000003" and list(changes.new) == [url + "d.jsonl"]
    assert changes.changed == [(url + "a.jsonl", "g1-b000001")]
    assert "a.jsonl (batch g1-b000001)" in (changes.waiting() or "")


def test_credentials_appear_in_no_output_log_or_error(s3, fresh_clients, tmp_path, caplog, monkeypatch):
    bucket = s3.make_bucket("no-secrets")
    s3.client().put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=b'{"text": "hello"}\n{"oops"\n')
    url = f"s3://{bucket}/corpus/"
    caplog.set_level(logging.INFO)
    log = logging.getLogger("tokenmill.test")
    data = tmp_path / "data"
    register_new_files(data, RemoteLocation(url), source_state(RemoteLocation(url)))
    ingest(url, data / "raw_records", log=log)
    with pytest.raises(SourceError) as missing:
        ingest(f"s3://{bucket}/nothing-here/", tmp_path / "none")

    secret, key_id = s3.secret_key, s3.access_key
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + secret)
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(SourceError) as forbidden:
        ingest(url, tmp_path / "forbidden")
    assert str(forbidden.value).count("\n") == 0 and url in str(forbidden.value)
    with pytest.raises(SourceError) as in_url:
        ingest(f"s3://{key_id}:{secret}@{bucket}/corpus/", tmp_path / "in-url")
    assert "credentials in the URL are not accepted" in str(in_url.value)

    said = [caplog.text, str(missing.value), str(forbidden.value), str(in_url.value)]
    written = [p.read_bytes().decode("utf-8", "replace") for p in data.rglob("*") if p.is_file()]
    for text in said + written:
        assert secret not in text and key_id not in text and ("wrong-" + secret) not in text


def test_a_single_object_is_a_source(s3, fresh_clients, tmp_path):
    bucket = s3.make_bucket("one-object")
    body = io.BytesIO()
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), body, row_group_size=1)
    s3.client().put_object(Bucket=bucket, Key="data/rows.parquet", Body=body.getvalue())
    url = f"s3://{bucket}/data/rows.parquet"
    result = ingest(url, tmp_path / "out")
    assert [r["source"] for r in records(tmp_path / "out")] == [{"path": url, "index": i} for i in range(3)]
    assert result.files_read == 1


@pytest.mark.parametrize("throttled", [{"GET": 5}], indirect=True)
def test_a_read_throttled_past_the_last_try_rejects_its_file_by_name(s3, throttled, tmp_path, monkeypatch):
    monkeypatch.setattr(RETRIES, "base_delay_s", 0.001)  # the same tries, without seconds of backoff
    bucket = s3.make_bucket("throttled-out")
    client = s3.client()
    client.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=b'{"text": "never read"}\n')
    client.put_object(Bucket=bucket, Key="corpus/b.jsonl", Body=b'{"text": "read"}\n')
    url = f"s3://{bucket}/corpus/"

    result = ingest(url, tmp_path / "out", workers=1)

    assert result.docs_out == 1 and result.remote_retries == 4
    (entry,) = iter_jsonl(tmp_path / "out" / REJECTED_FILE)
    assert entry["path"] == url + "a.jsonl" and entry["reason"] == "unreadable_file"
    assert entry["detail"].startswith(f"StillFailing: {url}a.jsonl: still failing after 5 tries: ")
    assert "\n" not in entry["detail"] and s3.secret_key not in entry["detail"]


def test_listing_goes_through_every_page(s3, fresh_clients, monkeypatch):
    bucket = s3.make_bucket("paged-listing")
    client = s3.client()
    keys = [f"corpus/{d}/part-{i}.jsonl" for d in ("a", "b/c", "d") for i in range(3)]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b'{"text": "x"}\n')
    pages = []
    call = s3fs.S3FileSystem._call_s3

    async def two_keys_a_page(self, method, *args, **kwargs):  # pages of 2 keys, as AWS's are of 1,000
        if method == "list_objects_v2" and "MaxKeys" not in kwargs:
            kwargs["MaxKeys"] = 2
            pages.append(kwargs.get("ContinuationToken"))
        return await call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", two_keys_a_page)
    state = source_state(RemoteLocation(f"s3://{bucket}/corpus/"))
    assert sorted(state) == sorted(f"s3://{bucket}/{key}" for key in keys)
    assert len(pages) >= 5 and pages[0] is None and all(pages[1:])
