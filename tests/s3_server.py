"""A real S3 server for tests: moto's standalone server on the loopback, on a free port.

Clients reach it the way they reach any S3: s3fs (through fsspec) reads credentials and the
endpoint from the environment (`AWS_ENDPOINT_URL`), so a job started as a subprocess with the
same environment talks to the same server. Nothing is mocked in the client.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from typing import Dict, Iterator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server() -> Iterator[Dict[str, str]]:
    """Start the server; yields the environment a client needs (also set in os.environ meanwhile)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _forget_clients()  # fsspec caches filesystems by arguments: one made under other settings must not answer
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
        _forget_clients()


def _forget_clients() -> None:
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()


def new_bucket() -> str:
    """A fresh bucket on the running server; returns its name."""
    import fsspec

    name = f"bcgen-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("s3")
    fs.mkdir(name)
    fs.invalidate_cache()
    return name
