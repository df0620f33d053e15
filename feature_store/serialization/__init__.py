"""Pure codecs of the on-Redis format: feature names to fields, values to bytes.

Nothing here touches Redis, Spark or the web. Ingest, push writes and serving all use it
unchanged, so a value written by any of them reads back identically through any other.
"""

from feature_store.serialization.codecs import (
    Codec,
    FeatureType,
    Value,
    codec_for,
    decode_float,
    encode_double,
    encode_float32,
    varint,
)
from feature_store.serialization.names import field_name

__all__ = [
    "Codec",
    "FeatureType",
    "Value",
    "codec_for",
    "decode_float",
    "encode_double",
    "encode_float32",
    "field_name",
    "varint",
]
