"""Images stored as LitData's streaming chunks (made by `shard`), in a folder or in object storage.

A sharded dataset is one folder (or URL prefix) holding a LitData dataset per split (train/, val/,
test/) and dataset.json, written last: the class names and the images of each split. Remote data
is read through a local cache of chunks, which LitData fills ahead of training and trims to size.
"""

import contextlib
import functools
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torchvision.transforms import v2

from ..errors import ConfigError, MissingError, changed_settings
from ..hardware.network import is_remote
from ..training.checkpoint_io import write_whole
from ..transforms import at_epoch
from .images import IMAGE_SUFFIXES, SaidOnce, labelled_image
from .sampling import draw_seed, epoch_restarts, seeded_draws

try:  # the `streaming` extra
    from litdata import StreamingDataLoader, StreamingDataset, optimize
    from litdata.processing.data_processor import DataProcessor
    from litdata.streaming import downloader
    from litdata.streaming.fs_provider import _get_fs_provider
    from litdata.streaming.resolver import Dir
    from litdata.streaming.sampler import ChunkedIndex
except ImportError as missing:
    raise ConfigError('Streaming data needs LitData, the streaming extra: pip install -e ".[streaming]"') from missing

MANIFEST = "dataset.json"
# Object stores LitData reads and writes, and the variables that configure each.
STORES = {"s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials), and AWS_ENDPOINT_URL "
          "for an S3-compatible store", "gs": "GOOGLE_APPLICATION_CREDENTIALS", "r2": "R2 credentials"}  # fmt: skip


def allow_plain_http() -> None:
    """object_store's AWS_ALLOW_HTTP=true (an S3-compatible endpoint without TLS), which LitData's
    S3 client does not read from the environment."""
    if os.environ.get("AWS_ALLOW_HTTP", "").lower() == "true":
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"


allow_plain_http()  # here too for data workers, which import this module to read the chunks


def join(location: str, *parts: str) -> str:
    return "/".join([location.rstrip("/"), *parts]) if is_remote(location) else os.path.join(location, *parts)


def check_storage(location: str, timeout: float = 5.0) -> None:
    """Fail in one line, within seconds, where remote storage cannot be used: an unknown scheme, no
    credentials, an endpoint that does not answer, credentials it refuses, a missing bucket."""
    if not is_remote(location):
        return
    scheme = urlparse(location).scheme
    if scheme not in STORES:
        raise ConfigError(f"{location}: LitData reads {', '.join(s + '://' for s in STORES)} URLs or local folders.")
    if scheme != "s3":
        return  # checked by LitData's own client when it starts
    import boto3
    import botocore.config
    import botocore.exceptions

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if endpoint.startswith("http://") and os.environ.get("AWS_ALLOW_HTTP", "").lower() != "true":
        raise ConfigError(
            f"The storage endpoint {endpoint} is plain HTTP, which LitData's S3 client refuses: use https://, "
            "or set AWS_ALLOW_HTTP=true on a network you trust."
        )
    allow_plain_http()
    session = boto3.Session()
    if session.get_credentials() is None:
        raise ConfigError(f"No credentials for {location}: set {STORES['s3']}.")
    config = botocore.config.Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1})
    client = session.client("s3", config=config)
    bucket = urlparse(location).netloc
    try:
        client.head_bucket(Bucket=bucket)
    except botocore.exceptions.EndpointConnectionError as error:
        raise ConfigError(
            f"Cannot reach the storage endpoint of {location} ({error}): check AWS_ENDPOINT_URL."
        ) from None
    except botocore.exceptions.ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket"):
            raise MissingError(f"There is no bucket {bucket} for {location}: create it or fix the URL.") from None
        raise ConfigError(
            f"The store refused access to {location} ({code or error}): check the credentials ({STORES['s3']})."
        ) from None
    except botocore.exceptions.BotoCoreError as error:
        raise ConfigError(f"Cannot use {location}: {error}") from None


def read_manifest(location: str) -> dict:
    """The classes and splits of a sharded dataset; an error naming the fix when there is none."""
    check_storage(location)
    if is_remote(location):
        with tempfile.TemporaryDirectory() as folder:
            local = os.path.join(folder, MANIFEST)
            provider = _get_fs_provider(location)
            if not provider.exists(join(location, MANIFEST)):
                raise MissingError(unfinished(location))
            provider.download_file(join(location, MANIFEST), local)
            return json.loads(Path(local).read_text())
    path = Path(location) / MANIFEST
    if not path.is_file():
        raise MissingError(unfinished(location))
    return json.loads(path.read_text())


def unfinished(location: str) -> str:
    if not is_remote(location) and not Path(location).is_dir():
        return f"No sharded dataset at {location}: make one with `shard <image folder> {location}`."
    if not is_remote(location) and any(path.suffix.lower() in IMAGE_SUFFIXES for path in Path(location).rglob("*")):
        return (
            f"{location} holds images, not shards: use --data.format folder, or shard them into another folder "
            f"(`shard {location} <output folder>`)."
        )
    return (
        f"{location} has no {MANIFEST}, so it is not a finished sharded dataset (a shard run that was cut short, "
        f"or an image folder): run `shard <image folder> {location}` again, or use --data.format folder."
    )


def write_manifest(location: str, manifest: dict) -> None:
    text = json.dumps(manifest, indent=1)
    if is_remote(location):
        with tempfile.TemporaryDirectory() as folder:
            local = Path(folder) / MANIFEST
            local.write_text(text)
            _get_fs_provider(location).upload_file(str(local), join(location, MANIFEST))
    else:
        write_whole(Path(location) / MANIFEST, text)


@contextlib.contextmanager
def private_optimizer_cache() -> Iterator[None]:
    """LitData stages chunks in one folder per machine (/tmp/chunks and /tmp/data) and empties it as
    each write starts: two shard commands at once would delete each other's chunks. Each write gets
    its own, under DATA_OPTIMIZER_CACHE_FOLDER where the user has moved it."""
    names = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")
    before = {name: os.environ.get(name) for name in names}
    with tempfile.TemporaryDirectory(prefix="shard-", dir=before["DATA_OPTIMIZER_CACHE_FOLDER"]) as folder:
        os.environ.update({names[0]: os.path.join(folder, "chunks"), names[1]: os.path.join(folder, "data")})
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def write_split(encode: Callable[[Any], dict], inputs: list, location: str, workers: int, chunk_bytes: int) -> None:
    """One split's samples, each encoded by `encode` in one of `workers` processes, as chunks."""
    # LitData prints a dozen status lines per split and an advert for its cloud (its workers too,
    # which fork with this redirection); its progress bar, on stderr, stays.
    with contextlib.redirect_stdout(io.StringIO()), private_optimizer_cache(), workers_stopped_on_ctrl_c():
        optimize(
            fn=encode,
            inputs=inputs,
            output_dir=location,
            num_workers=workers,
            chunk_bytes=chunk_bytes,
            mode="overwrite",  # a rerun replaces what an earlier one left
            reorder_files=False,  # keep the inputs' order (LitData otherwise sorts them by file size)
            start_method="fork",  # from this command's one thread; spawn would start each worker from scratch
        )


@contextlib.contextmanager
def workers_stopped_on_ctrl_c() -> Iterator[None]:
    """LitData's Ctrl-C handler ends the command at once with status 0, as if it had written every
    chunk, and leaves its workers writing when the Ctrl-C reached the command alone. Here the workers
    are stopped, and the Ctrl-C goes on as Python's (cli.main's one line, status 130)."""

    def stop(processor: DataProcessor, signum: int, frame) -> None:
        for worker in getattr(processor, "workers", []):
            worker.terminate()
        for worker in getattr(processor, "workers", []):
            worker.join()
        raise KeyboardInterrupt

    litdata_own = DataProcessor._signal_handler
    DataProcessor._signal_handler = stop
    try:
        yield
    finally:
        DataProcessor._signal_handler = litdata_own


def delete_manifest(location: str) -> None:
    if is_remote(location):
        provider = _get_fs_provider(location)
        if provider.exists(join(location, MANIFEST)):
            provider.delete_file_or_directory(join(location, MANIFEST))
    else:
        Path(location).mkdir(parents=True, exist_ok=True)
        (Path(location) / MANIFEST).unlink(missing_ok=True)


class ShardedImages(StreamingDataset):
    """One split of a sharded dataset: (image, label) pairs decoded from the stored bytes and passed
    through `transform`, an unreadable image handled as in the folder format (data.bad_images).

    Under DDP, LitData gives each process and worker its own chunks (no DistributedSampler), every
    image once (the loader's drop_last evens the shares out, dropping the few left over). Its state
    (how many samples were read) lets a resumed run go on from the next unseen sample.
    """

    def __init__(
        self,
        location: str,
        split: str,
        transform: v2.Transform,
        skip_unreadable: bool,
        shuffle: bool,
        seed: int,
        cache_dir: str | None = None,
        max_cache_size: str = "50GB",
        named: bool = False,
        sharded_from: str | None = None,
    ) -> None:
        source = join(location, split)
        if is_remote(location):
            # The cache of each split in its own folder: LitData keys it by the URL only when it picks it.
            cache = os.path.join(cache_dir, split) if cache_dir else None
            source = Dir(path=cache, url=source) if cache else source
        super().__init__(source, shuffle=shuffle, seed=seed, drop_last=False, max_cache_size=max_cache_size)
        # Not `transform`: StreamingDataset applies an attribute of that name to the stored sample.
        self.location, self.image_transform, self.skip_unreadable = location, transform, skip_unreadable
        self.named = named  # each image with its name in place of its label, as ImageFiles's
        self.sharded_from = sharded_from  # the image folder, where an unreadable image is to be mended
        self._skips_said = SaidOnce(sum(end - start for start, end in self.region_of_interest))

    def __getitem__(self, index) -> tuple[torch.Tensor, int] | None:
        item = super().__getitem__(index)
        # Named for the messages as it was found: no file of that path is in the shards' folder.
        origin = f", sharded from {self.sharded_from}" if self.sharded_from else ""
        said = f"{item['path']} in {self.location}{origin}"
        # Augmented with draws seeded by the run, the epoch and the image, which a resumed run repeats
        # (LitData keeps the epoch in its state) whatever the workers drew before.
        image = index.index if isinstance(index, ChunkedIndex) else index  # its place in the split
        # LitData counts epochs from 1.
        transform = at_epoch(self.image_transform, self.current_epoch - 1)
        with seeded_draws(draw_seed(self.seed, self.current_epoch, image)):
            # Named by the file it was sharded from (predict's CSV), which exists, where the shards hold none.
            label = join(self.sharded_from or self.location, item["path"]) if self.named else item["label"]
            first_skip = functools.partial(self._skips_said.first, image)
            return labelled_image(item["image"], label, said, transform, self.skip_unreadable, first_skip)


class StreamingLoader(StreamingDataLoader):
    """LitData's loader, whose restored position holds for the one epoch it interrupted. LitData
    forgets it when that epoch's iterator runs out, but Lightning stops at the epoch's length before
    the iterator learns that it has ended, and the next epoch would start at the end."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._resumed = False

    def __iter__(self):
        if self._resumed:
            self.restore = False
        self._resumed = self.restore
        yield from super().__iter__()


def resume_position(loader: StreamingLoader, position: dict) -> None:
    """Continue an interrupted epoch at the next unseen image. LitData's position is a count of the
    images read, which the same processes, workers and batch size turn into the same images."""
    settings = ("world_size", "num_workers", "batch_size")
    now = {key: loader.state_dict()["dataset"][key] for key in settings}
    if changed := changed_settings(position["dataset"], now):
        rank_zero_warn(epoch_restarts(changed))
        return
    loader.load_state_dict(position)
