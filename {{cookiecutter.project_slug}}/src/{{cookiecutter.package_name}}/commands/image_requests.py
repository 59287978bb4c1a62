"""The image in an HTTP request to `serve`, or the reason there is none, as a status and one line.

A request carries one image, as any of:
- its bytes as the body, with Content-Type image/<any> or application/octet-stream;
- a multipart/form-data upload whose file field is named `image`;
- JSON, {"image": "<the bytes in base64>"}, or a data URL as a browser makes it
  ({"image": "data:image/png;base64,<...>"}).
Only bytes are read: nothing a client sends names a file, and nothing is unpickled.
"""

import base64
import binascii
import io
import json
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError
from starlette.requests import Request

ACCEPTED = (
    "send the image as the body (Content-Type image/jpeg, image/png, ... or application/octet-stream), "
    'as a multipart upload named "image", or as JSON {"image": "<base64>"}'
)


class BadImageRequest(Exception):
    """A request `serve` answers with `status` and the message, as JSON {"error": message}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    request_bytes: int = 32_000_000
    image_bytes: int = 20_000_000
    # Decoded, 40 megapixels take 120 MB: enough for any camera, not for a decompression bomb.
    pixels: int = 40_000_000


async def read_body(request: Request, limits: Limits) -> bytes:
    """The body, read no further than the limit: a client cannot make the server hold more."""
    most = limits.request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > most:
        raise BadImageRequest(413, f"The request is {int(declared):,} bytes; this server takes {most:,}.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > most:
            raise BadImageRequest(413, f"The request is over {most:,} bytes, the most this server takes.")
        chunks.append(chunk)
    return b"".join(chunks)


async def image_bytes(request: Request, body: bytes, limits: Limits) -> bytes:
    """The encoded image the request carries, checked for its size and its pixel count, not decoded."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not body:
        raise BadImageRequest(400, f"The request has no body: {ACCEPTED}.")
    if media_type.startswith("image/") or media_type == "application/octet-stream":
        data = body
    elif media_type == "multipart/form-data":
        data = await uploaded_file(request, body)
    elif media_type == "application/json":
        data = base64_image(body)
    else:
        raise BadImageRequest(415, f"Content-Type {media_type or '(none)'} is not one this server reads: {ACCEPTED}.")
    if not data:
        raise BadImageRequest(400, "The image is empty (0 bytes).")
    if len(data) > limits.image_bytes:
        raise BadImageRequest(413, f"The image is {len(data):,} bytes; this server takes {limits.image_bytes:,}.")
    check_pixels(data, limits.pixels)
    return data


async def uploaded_file(request: Request, body: bytes) -> bytes:
    async def replay() -> dict:  # the body, already read under the size limit, for the form parser
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=10)
    except Exception as error:  # the multipart parser's errors share no base class
        raise BadImageRequest(400, f"The multipart body cannot be read ({error}).") from None
    upload = form.get("image")
    if upload is None or isinstance(upload, str):
        raise BadImageRequest(400, 'The multipart upload has no file field named "image".')
    return await upload.read()


def base64_image(body: bytes) -> bytes:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadImageRequest(400, 'The body is not JSON: send {"image": "<base64>"}.') from None
    encoded = payload.get("image") if isinstance(payload, dict) else None
    if not isinstance(encoded, str):
        raise BadImageRequest(400, 'The JSON has no "image" string: send {"image": "<base64>"}.')
    if encoded.startswith("data:"):  # FileReader.readAsDataURL's, canvas.toDataURL's
        header, _, encoded = encoded.partition(",")
        if not header.endswith(";base64"):
            raise BadImageRequest(400, 'The "image" data URL is not base64 (data:image/png;base64,...).')
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise BadImageRequest(400, 'The "image" field is not valid base64.') from None


def check_pixels(data: bytes, limit: int) -> None:
    """Read the image's header, not its pixels: an image too large to decode is refused before it is."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError:
        raise BadImageRequest(413, f"The image has over {limit:,} pixels, the most this server takes.") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise BadImageRequest(400, "The body is not an image this server can read (JPEG, PNG, WebP, ...).") from None
    if width * height > limit:
        raise BadImageRequest(413, f"The image is {width} x {height} pixels; this server takes {limit:,} in all.")
