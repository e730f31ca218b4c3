"""What an encoded image's first bytes say, read in the TensorFlow graph before any pixel is
decoded: its format (`FORMATS`), the size its header declares (`DECLARED_SIZE`, for the pixel
limit), and the files TensorFlow's decoders would read wrongly or not at all, refused by name
(`REFUSALS`: a truncated JPEG, an animated WebP, BMPs of a colour palette, of 1, 4 or 16 bits a
pixel, compressed or with other channel masks, an OS/2 BMP). `keras_vit.images` decodes.
"""

import tensorflow as tf

FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WebP")


# Every header field read below lies in the first 72 bytes (a BMP's channel masks end at 66).
HEADER_BYTES = 72


def _padded(data, start, length):
    """`length` bytes (a Python int) of a scalar string tensor from `start` (an int64 scalar,
    or a Python int), zero-padded past its end: read without copying the file."""
    start = tf.minimum(tf.cast(start, tf.int64), tf.cast(tf.strings.length(data), tf.int64))
    part = tf.strings.substr(data, start, tf.constant(length, tf.int64))
    return tf.strings.substr(tf.strings.join([part, tf.constant(b"\0" * length)]), 0, length)


def header(data):
    """The first `HEADER_BYTES` bytes of a scalar string tensor, zero-padded."""
    return _padded(data, 0, HEADER_BYTES)


def _uint(head, start, length, little_endian):
    """An unsigned integer of `length` bytes at `start` of a header, as int64."""
    raw = tf.cast(tf.io.decode_raw(tf.strings.substr(head, start, length), tf.uint8), tf.int64)
    if not little_endian:
        raw = tf.reverse(raw, [0])
    return tf.reduce_sum(raw * tf.constant([256**i for i in range(length)], tf.int64))


def image_format(data, head=None):
    """The format of an encoded image (scalar string tensor) as an int32 index into
    `FORMATS`, or -1 for anything else. Reads the first bytes only (`head`: `header(data)`)."""
    head = header(data) if head is None else head
    checks = [
        tf.io.is_jpeg(data),
        tf.strings.substr(head, 0, 8) == b"\x89PNG\r\n\x1a\n",
        tf.logical_or(tf.strings.substr(head, 0, 6) == b"GIF87a",
                      tf.strings.substr(head, 0, 6) == b"GIF89a"),
        tf.strings.substr(head, 0, 2) == b"BM",
        tf.logical_and(tf.strings.substr(head, 0, 4) == b"RIFF",
                       tf.strings.substr(head, 8, 4) == b"WEBP"),
    ]
    index = tf.constant(-1)
    for i in reversed(range(len(checks))):
        index = tf.where(checks[i], tf.constant(i), index)
    return index


def _webp_size(head):
    chunk = tf.strings.substr(head, 12, 4)
    lossy = (_uint(head, 28, 2, True) & 0x3FFF, _uint(head, 26, 2, True) & 0x3FFF)
    bits = _uint(head, 21, 4, True)  # VP8L: 14 bits width - 1, then 14 bits height - 1
    lossless = ((tf.bitwise.right_shift(bits, 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1)
    extended = (_uint(head, 27, 3, True) + 1, _uint(head, 24, 3, True) + 1)  # VP8X canvas
    return tuple(
        tf.where(chunk == b"VP8L", ll, tf.where(chunk == b"VP8X", ex, ly))
        for ll, ex, ly in zip(lossless, extended, lossy)
    )


def _bmp_side(head, start):
    value = tf.bitcast(tf.cast(_uint(head, start, 4, True), tf.uint32), tf.int32)
    return tf.abs(tf.cast(value, tf.int64))  # negative heights mean top-down rows


# An OS/2 BMP's BITMAPCOREHEADER is 12 bytes with 16-bit unsigned sides; every later header
# (BITMAPINFOHEADER and its successors, 40 bytes and up) has signed 32-bit sides.
_BMP_CORE_HEADER_SIZE = 12


def _bmp_size(head):
    """A Windows BMP's (height, width); an OS/2 BMP is refused before its size is read."""
    return _bmp_side(head, 22), _bmp_side(head, 18)


# WebP's extended header (VP8X) flags: bit 1 marks an animation (WebP container spec).
_WEBP_ANIMATION_FLAG = 0x02


def _webp_animated(head):
    """Whether a WebP file's header (`header`) has the VP8X chunk's animation flag."""
    return tf.logical_and(
        tf.strings.substr(head, 12, 4) == b"VP8X",
        tf.bitwise.bitwise_and(_uint(head, 20, 1, True), _WEBP_ANIMATION_FLAG) > 0)


def jpeg_is_complete(data):
    """Whether a JPEG (scalar string tensor) has an end-of-image marker (FF D9) after the
    start of its last scan (FF DA): false for a truncated file. Entropy-coded data stuffs each
    FF byte as FF 00, so neither marker appears inside it; an embedded thumbnail's markers come
    before the main image's scans. A file that ends with FF D9 has its last FF D9 after any
    FF DA, so only the others are scanned."""

    def scan():
        raw = tf.io.decode_raw(data, tf.uint8)
        marker = raw[:-1] == 0xFF

        def last(code):  # the position of the last FF `code`, or -1
            found = tf.where(tf.logical_and(marker, raw[1:] == code))[:, 0]
            return tf.reduce_max(tf.concat([tf.constant([-1], tf.int64), found], 0))

        return last(0xD9) > last(0xDA)

    length = tf.strings.length(data)
    ends = tf.strings.substr(data, tf.maximum(length - 2, 0), 2) == b"\xff\xd9"
    return tf.cond(ends, lambda: tf.constant(True), scan)


def _jpeg_size(data):
    shape = tf.cast(tf.io.extract_jpeg_shape(data), tf.int64)
    return shape[0], shape[1]


# Per format (in `FORMATS`' order): the (height, width) its header declares, as int64 scalars,
# from the file and its `header`.
DECLARED_SIZE = (
    lambda data, head: _jpeg_size(data),
    lambda data, head: (_uint(head, 20, 4, False), _uint(head, 16, 4, False)),  # PNG IHDR
    lambda data, head: (_uint(head, 8, 2, True), _uint(head, 6, 2, True)),  # GIF screen
    lambda data, head: _bmp_size(head),
    lambda data, head: _webp_size(head),
)


def _bmp_is_os2(head):
    """Whether a BMP file's header (`header`) is an OS/2 BITMAPCOREHEADER, which TensorFlow's
    BMP decoder misreads."""
    return _uint(head, 14, 4, True) == _BMP_CORE_HEADER_SIZE


# A Windows BMP's fields (its file header is 14 bytes, the info header follows): where its
# pixels start, the info header's size, the bits a pixel, the compression, the colour count
# and, where the compression is BI_BITFIELDS, the red, green and blue masks after the 40-byte
# BITMAPINFOHEADER.
_BMP_FIELDS = (10, 14, 28, 30, 46, 54, 58, 62)
_BMP_RGB, _BMP_BITFIELDS = 0, 3
# The masks TensorFlow's decoder assumes: pixels stored blue, green, red (and alpha).
_BMP_BGR_MASKS = (0x00FF0000, 0x0000FF00, 0x000000FF)


def _bmp_fields(head):
    """A Windows BMP's 32-bit little-endian fields (`_BMP_FIELDS`' order) from its `header`,
    read together."""
    raw = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)
    places = tf.constant([[at + i for i in range(4)] for at in _BMP_FIELDS], tf.int32)
    return tf.unstack(tf.reduce_sum(tf.gather(raw, places) * tf.constant(
        [1, 256, 256**2, 256**3], tf.int64), axis=1))


def _bmp_misread(data, head):
    """Whether TensorFlow's decoder reads a Windows BMP's pixels wrongly: 1, 4 or 16 bits a
    pixel, a compression other than none or BI_BITFIELDS (RLE, alpha bitfields), BI_BITFIELDS
    masks other than blue, green, red, or 8 bits with a palette other than grey level k at
    index k (it gives each pixel its index as a grey level, not its palette colour)."""
    pixels, info, bits, compression, colours, *masks = _bmp_fields(head)
    bits = bits % 65536  # a 16-bit field, the compression's low half above it
    other_masks = tf.logical_and(compression == _BMP_BITFIELDS, tf.reduce_any(
        tf.stack(masks) != tf.constant(_BMP_BGR_MASKS, tf.int64)))
    # The palette entries the file holds: as many as it declares (0: 256), those before its
    # pixels (a writer may write fewer) and within the file.
    start = 14 + info  # the palette follows the info header
    written = (tf.minimum(pixels, tf.cast(tf.strings.length(data), tf.int64)) - start) // 4
    colours = tf.minimum(tf.where(colours == 0, tf.constant(256, tf.int64), colours), written)
    palette = tf.io.decode_raw(_padded(data, start, 4 * 256), tf.uint8)
    palette = tf.cast(tf.reshape(palette, [256, 4])[:, :3], tf.int64)
    index = tf.range(256, dtype=tf.int64)[:, None]
    coloured = tf.reduce_any(tf.logical_and(palette != index, index < colours))
    return tf.reduce_any(tf.stack([
        tf.logical_not(tf.reduce_any(bits == tf.constant([8, 24, 32], tf.int64))),
        tf.logical_not(tf.reduce_any(compression == tf.constant([_BMP_RGB, _BMP_BITFIELDS],
                                                                tf.int64))),
        other_masks,
        tf.logical_and(bits == 8, coloured)]))


# Per format (in `FORMATS`' order): the files its decoder cannot read right, refused before
# decoding, as pairs (a test of the file and its `header`, giving a boolean scalar; the
# reason).
REFUSALS = (
    ((lambda data, head: tf.logical_not(jpeg_is_complete(data)),
      "is not a readable JPEG image (truncated: no end-of-image marker after its last scan)"),),
    (),
    (),
    ((lambda data, head: _bmp_is_os2(head),
      "is an OS/2 BMP image (12-byte BITMAPCOREHEADER), which cannot be decoded. Expected a "
      "Windows BMP (e.g. re-saved with Pillow)"),
     (_bmp_misread,
      "is a BMP image that cannot be decoded right: a colour palette (its pixels would read as "
      "grey levels), 1, 4 or 16 bits a pixel, compressed (RLE), or channel masks other than "
      "blue, green, red. Expected a BMP of 24 or 32 bits a pixel, or of 8 with grey levels "
      "(or the image as PNG)")),
    ((lambda data, head: _webp_animated(head),
      "is an animated WebP image; animated images are not supported. Expected a still "
      "image"),),
)
