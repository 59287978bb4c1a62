"""What is on the network: whether a location is (object storage, a URL), and whether a server can
be reached, found out in seconds (the libraries that find out for themselves retry for a minute or
more before they fail)."""

import os
import socket


def reachable(host: str, timeout: float = 3.0) -> bool:
    """Whether a connection to `host`'s HTTPS port opens within `timeout` seconds (behind an HTTPS
    proxy, which this cannot probe, it is taken to)."""
    if any(os.environ.get(variable) for variable in ("HTTPS_PROXY", "https_proxy")):
        return True
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def is_remote(location: str | os.PathLike) -> bool:
    """Whether `location` is a URL (s3://, gs://, https://, ...) rather than a local path: object
    storage, read and written through its libraries, never through pathlib."""
    return "://" in str(location)
