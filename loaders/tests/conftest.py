import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from devtools.s3_server import s3_fixtures  # noqa: E402 (tm_writer's folder first)

# a real S3 server on loopback (SeaweedFS) for open_store("s3://..."): `s3`, and `s3_env` with its AWS variables
s3, s3_env = s3_fixtures()
