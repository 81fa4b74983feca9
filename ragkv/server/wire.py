"""Find what made a request undecodable, from the raw wire bytes.

protobuf rejects a string field holding invalid UTF-8 with a bare "Error parsing
message"; the error interceptor calls `invalid_utf8_field` to name the field in
its INVALID_ARGUMENT message (e.g. "chunks[1]", "compression.policy").
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]  # IndexError on truncation: the caller gives up
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _is_repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return field.label == FieldDescriptor.LABEL_REPEATED


def invalid_utf8_field(descriptor: Descriptor, data: bytes, prefix: str = "") -> str | None:
    """Dotted path of the first string field (recursing into messages) whose bytes are not UTF-8."""
    seen: dict[int, int] = {}
    pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == _VARINT:
                _, pos = _varint(data, pos)
            elif wire_type == _I64:
                pos += 8
            elif wire_type == _I32:
                pos += 4
            elif wire_type == _LEN:
                length, pos = _varint(data, pos)
                value, pos = data[pos:pos + length], pos + length
                field = descriptor.fields_by_number.get(number)
                if field is None:
                    continue
                name = field.name
                if _is_repeated(field):
                    index = seen.get(number, 0)
                    seen[number] = index + 1
                    name = f"{name}[{index}]"
                if field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        value.decode("utf-8")
                    except UnicodeDecodeError:
                        return prefix + name
                elif field.type == FieldDescriptor.TYPE_MESSAGE:
                    inner = invalid_utf8_field(field.message_type, value, f"{prefix}{name}.")
                    if inner is not None:
                        return inner
            else:
                return None  # groups or garbage: nothing more to say
    except (IndexError, ValueError):
        return None
    return None
