"""TFRecord files of ``tf.train.Example`` records, written and read without TensorFlow.

A TFRecord file is a run of records, each framed as TensorFlow's
``RecordWriter`` frames it: the payload's length (8 bytes, little-endian),
a masked CRC-32C of the length, the payload, a masked CRC-32C of the payload.
The payload here is a ``tf.train.Example``: its messages are declared below
with TensorFlow's field numbers in a descriptor pool of tfdist's own, so the
protobuf runtime encodes and parses them and TensorFlow (its ``parse_example``,
``TFRecordDataset``) reads what this writes, and the other way round. The
preprocess stage writes and checks records here, in a process that never
imports TensorFlow (seconds of start-up and hundreds of MB).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

from tfdist.errors import InputError

_MASK_DELTA = 0xA282EAD8
_U64, _U32 = struct.Struct("<Q"), struct.Struct("<I")


def _masked_crc(data: bytes) -> int:
    """TensorFlow's masked CRC-32C (``crc32c::Mask``): rotated and offset, so a CRC of CRCs stays strong."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def framed(payload: bytes) -> bytes:
    """One record as a TFRecord file holds it."""
    length = _U64.pack(len(payload))
    return length + _U32.pack(_masked_crc(length)) + payload + _U32.pack(_masked_crc(payload))


def read_records(path: Path, handle: BinaryIO | None = None) -> Iterator[bytes]:
    """The payloads of a TFRecord file (uncompressed), each frame's CRCs checked.

    Raises:
        InputError: a frame that is cut short or whose CRC does not match, naming the file and the record's index.
    """
    with (open(path, "rb") if handle is None else handle) as stream:
        index = 0
        while header := stream.read(12):
            if len(header) < 12:
                raise InputError(f"{path}: record {index} is cut short (its header has {len(header)} of 12 bytes)")
            length = _U64.unpack_from(header)[0]
            if _U32.unpack_from(header, 8)[0] != _masked_crc(header[:8]):
                raise InputError(f"{path}: record {index}'s length fails its CRC; the file is damaged or not a "
                                 "TFRecord file (GZIP-compressed files: unzip them first)")
            payload, footer = stream.read(length), stream.read(4)
            if len(payload) < length or len(footer) < 4:
                raise InputError(f"{path}: record {index} is cut short ({len(payload)} of {length} bytes)")
            if _U32.unpack(footer)[0] != _masked_crc(payload):
                raise InputError(f"{path}: record {index} fails its CRC; the file is damaged")
            yield payload
            index += 1


def _example_class() -> Any:
    """The class of ``tf.train.Example``, declared with the messages it holds (tensorflow/core/example/
    {example,feature}.proto) in a descriptor pool of our own."""
    proto = descriptor_pb2.FileDescriptorProto(name="tfdist/example.proto", package="tfdist.example", syntax="proto3")
    field = descriptor_pb2.FieldDescriptorProto
    repeated, optional = field.LABEL_REPEATED, field.LABEL_OPTIONAL

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> descriptor_pb2.DescriptorProto:
        message = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            added = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name
        return message

    message("BytesList", ("value", 1, field.TYPE_BYTES, repeated, ""))
    message("FloatList", ("value", 1, field.TYPE_FLOAT, repeated, ""))
    message("Int64List", ("value", 1, field.TYPE_INT64, repeated, ""))
    feature = message("Feature", ("bytes_list", 1, field.TYPE_MESSAGE, optional, ".tfdist.example.BytesList"),
                      ("float_list", 2, field.TYPE_MESSAGE, optional, ".tfdist.example.FloatList"),
                      ("int64_list", 3, field.TYPE_MESSAGE, optional, ".tfdist.example.Int64List"))
    feature.oneof_decl.add(name="kind")
    for each in feature.field:
        each.oneof_index = 0
    features = message("Features", ("feature", 1, field.TYPE_MESSAGE, repeated, ".tfdist.example.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=field.TYPE_MESSAGE, label=optional, type_name=".tfdist.example.Feature")
    entry.options.map_entry = True
    message("Example", ("features", 1, field.TYPE_MESSAGE, optional, ".tfdist.example.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tfdist.example.Example"))


Example = _example_class()


def encode_example(image: bytes, label: int, image_key: str = "image", label_key: str = "label") -> bytes:
    """A ``tf.train.Example`` of an image's bytes and its integer label, serialized deterministically."""
    example = Example()
    example.features.feature[image_key].bytes_list.value.append(image)
    example.features.feature[label_key].int64_list.value.append(label)
    return example.SerializeToString(deterministic=True)


def decode_example(payload: bytes, image_key: str, label_key: str, where: str) -> tuple[bytes, int]:
    """An image's bytes and label from a ``tf.train.Example``; ``where`` names the record in the error.

    Raises:
        InputError: not an Example, or without one bytes ``image_key`` and one integer ``label_key``.
    """
    example = Example()
    try:
        example.ParseFromString(payload)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError (its module differs between runtimes)
        raise InputError(f"{where} is not a tf.train.Example ({err})") from None
    features = example.features.feature
    image, label = features.get(image_key), features.get(label_key)
    if image is None or label is None:
        raise InputError(f"{where} has no feature {image_key if image is None else label_key} (it has "
                         f"{', '.join(sorted(features)) or 'none'}); set data.tfrecord.image_key and label_key")
    if len(image.bytes_list.value) != 1:
        raise InputError(f"{where}: feature {image_key} must hold one encoded image (bytes_list of 1)")
    if len(label.int64_list.value) != 1:
        raise InputError(f"{where}: feature {label_key} must hold one integer label (int64_list of 1)")
    return image.bytes_list.value[0], int(label.int64_list.value[0])


class RecordWriter:
    """Writes framed records to a file; the records' count kept."""

    def __init__(self, path: Path):
        self.path, self.count = path, 0
        self._file = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 - closed by close()

    def write(self, payload: bytes) -> bytes:
        """Append one record; its frame, as written."""
        frame = framed(payload)
        self._file.write(frame)
        self.count += 1
        return frame

    def close(self) -> None:
        self._file.close()
