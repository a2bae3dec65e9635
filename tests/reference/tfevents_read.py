#!/usr/bin/env python3
"""Reads a TensorBoard event file the way TensorBoard's own reader does, without zeroth's code:
TFRecord framing (u64 length, masked CRC-32C of the length, the record, masked CRC-32C of the
record; CRC-32C from Debian's python3-crcmod), and each record parsed as a tensorflow `Event`
protocol buffer by Debian's python3-protobuf from a descriptor built here (Event, Summary,
Summary.Value with the field numbers of tensorflow/core/util/event.proto and summary.proto).
Used by tests/tools/monitors_test.cc:

    /usr/bin/python3 tests/reference/tfevents_read.py EVENT_FILE

Prints one JSON object per record: {"wall_time", "step", "file_version"} or
{"wall_time", "step", "scalars": {tag: simple_value}}. Exits 1 naming the record whose framing
or checksum is wrong.
"""
import json
import struct
import sys

import crcmod.predefined
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

CRC32C = crcmod.predefined.mkPredefinedCrcFun("crc-32c")


def masked(data):
    c = CRC32C(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    f = descriptor_pb2.FileDescriptorProto(name="event_subset.proto", package="tensorflow", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def field(msg, name, number, kind, label=T.LABEL_OPTIONAL, type_name=None):
        fd = msg.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            fd.type_name = type_name

    summary = f.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    field(value, "tag", 1, T.TYPE_STRING)
    field(value, "simple_value", 2, T.TYPE_FLOAT)
    field(summary, "value", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED, ".tensorflow.Summary.Value")
    event = f.message_type.add(name="Event")
    field(event, "wall_time", 1, T.TYPE_DOUBLE)
    field(event, "step", 2, T.TYPE_INT64)
    field(event, "file_version", 3, T.TYPE_STRING)
    field(event, "summary", 5, T.TYPE_MESSAGE, type_name=".tensorflow.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def main(path):
    Event = event_class()
    blob = open(path, "rb").read()
    at, index = 0, 0
    while at < len(blob):
        if at + 12 > len(blob):
            sys.exit(f"record {index}: {len(blob) - at} bytes left, too few for a length and its CRC")
        header = blob[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
        if masked(header) != length_crc:
            sys.exit(f"record {index}: the length's CRC is wrong")
        data = blob[at + 12:at + 12 + length]
        if len(data) != length or at + 16 + length > len(blob):
            sys.exit(f"record {index}: cut short")
        (data_crc,) = struct.unpack("<I", blob[at + 12 + length:at + 16 + length])
        if masked(data) != data_crc:
            sys.exit(f"record {index}: the record's CRC is wrong")
        e = Event()
        e.ParseFromString(data)
        out = {"wall_time": e.wall_time, "step": e.step}
        if e.file_version:
            out["file_version"] = e.file_version
        else:
            out["scalars"] = {v.tag: v.simple_value for v in e.summary.value}
        print(json.dumps(out))
        at += 16 + length
        index += 1


if __name__ == "__main__":
    main(sys.argv[1])
