#!/usr/bin/env python3
"""Writes the hostile and edge-case .npy and safetensors files of tests/corpus, and the
README of each folder (one line per file). Run it from anywhere after changing a case;
tests/corpus.rs reads the files and compares ptefs with NumPy and safetensors on them.
Needs only the standard library: every byte is written here, not by NumPy."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# .npy: (file, description, header bytes, data bytes)
F4x6 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)


def npy(dict_text, version=(1, 0), pad=True, encoding="latin1"):
    body = dict_text.encode(encoding)
    prefix = 10 if version == (1, 0) else 12
    if pad:
        total = -(-(prefix + len(body) + 1) // 64) * 64
        body = body + b" " * (total - prefix - len(body) - 1) + b"\n"
    out = b"\x93NUMPY" + bytes(version)
    out += struct.pack("<H" if version == (1, 0) else "<I", len(body))
    return out + body


def d(descr="'<f4'", fortran="False", shape="(2, 3)", extra=""):
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, %s}" % (descr, fortran, shape, extra)


NPY = [
    ("c_order_f4.npy", "float32 (2, 3) as np.save writes it", npy(d()), F4x6),
    ("scalar_f8.npy", "a 0-d float64", npy(d("'<f8'", shape="()")), struct.pack("<d", 2.5)),
    ("bool.npy", "bool (4,)", npy(d("'|b1'", shape="(4,)")), bytes([0, 1, 1, 0])),
    ("u1_big_marker.npy", "'>u1': one-byte types have no byte order (|u1)", npy(d("'>u1'", shape="(3,)")), b"\x01\x02\x03"),
    ("no_order_f4.npy", "'f4': this machine's order (<f4 here)", npy(d("'f4'")), F4x6),
    ("equals_f4.npy", "'=f4': this machine's order", npy(d("'=f4'")), F4x6),
    ("pipe_f4.npy", "'|f4': NumPy takes it as this machine's order", npy(d("'|f4'")), F4x6),
    ("big_endian_f4.npy", "'>f4': read as big-endian by both (validation refuses it for a <f4 tensor)", npy(d("'>f4'")), struct.pack(">6f", 1, 2, 3, 4, 5, 6)),
    ("raw_v2.npy", "'<V2': raw 2-byte items (|V2), as bfloat16 tensors are shown", npy(d("'<V2'", shape="(3,)")), b"\x80\x3f\x00\x40\x40\x40"),
    ("complex_c16.npy", "complex128 (2,)", npy(d("'<c16'", shape="(2,)")), struct.pack("<4d", 1, 2, 3, 4)),
    ("fortran_vector.npy", "fortran_order True of shape (1, 6): the same bytes as C order", npy(d(fortran="True", shape="(1, 6)")), F4x6),
    ("double_quotes.npy", "keys and descr in double quotes, no spaces", npy('{"descr":"<f4","fortran_order":False,"shape":(2,3)}'), F4x6),
    ("keys_reordered.npy", "shape first, a trailing comma in the tuple", npy("{'shape': (2, 3,), 'fortran_order': False, 'descr': '<f4'}"), F4x6),
    ("newlines.npy", "the dict spread over lines", npy("{'descr': '<f4',\n 'fortran_order': False,\n 'shape': (2, 3)}"), F4x6),
    ("version2.npy", "format 2.0 (4-byte header length)", npy(d(), (2, 0)), F4x6),
    ("version3.npy", "format 3.0 (UTF-8 header)", npy(d(), (3, 0)), F4x6),
    ("python2_long.npy", "1.0 with Python 2 longs (2L, 3L): NumPy removes the L", npy(d(shape="(2L, 3L)")), F4x6),
    ("unpadded.npy", "no padding and no newline after the dict", npy(d(), pad=False), F4x6),
    # Refused by both.
    ("extra_key.npy", "a fourth key", npy(d(extra="'x': 1, ")), F4x6),
    ("missing_shape.npy", "no 'shape'", npy("{'descr': '<f4', 'fortran_order': False}"), F4x6),
    ("int_not_tuple.npy", "shape (6) is an int, not a tuple", npy(d(shape="(6)")), F4x6),
    ("leading_zero_dim.npy", "dimension 06: a syntax error in Python 3", npy(d(shape="(06,)")), F4x6),
    ("fortran_not_bool.npy", "fortran_order 0", npy(d(fortran="0")), F4x6),
    ("descr_not_a_type.npy", "descr 'i3'", npy(d("'i3'", shape="(6,)")), F4x6[:18]),
    ("minor_version.npy", "format 1.1", npy(d(), (1, 1)), F4x6),
    ("version4.npy", "format 4.0", npy(d(), (4, 0)), F4x6),
    ("header_too_long.npy", "a header of 10048 bytes: NumPy reads at most 10000 without allow_pickle", npy(d() + " " * 10000), F4x6),
    ("data_short.npy", "one byte of data missing", npy(d()), F4x6[:-1]),
    ("header_cut.npy", "the header length reaches past the end of the file", npy(d())[:40], b""),
    ("indented_after.npy", "spaces after the newline that ends the dict", None, F4x6),
    ("version3_long.npy", "3.0 with 3L: the L is removed only for 1.0 and 2.0", npy(d(shape="(2L, 3L)"), (3, 0)), F4x6),
    ("nul_padding.npy", "padded with NUL bytes", None, F4x6),
    # NumPy accepts; ptefs refuses.
    ("descr_twice.npy", "'descr' twice, '<f4' then '>f4': NumPy keeps the last", npy("{'descr': '<f4', 'descr': '>f4', 'fortran_order': False, 'shape': (2, 3)}"), F4x6),
    ("fortran_twice.npy", "fortran_order False then True: NumPy reads the data transposed", npy("{'descr': '<f4', 'fortran_order': False, 'fortran_order': True, 'shape': (2, 3)}"), F4x6),
    ("shape_twice.npy", "'shape' twice: NumPy keeps the last", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'shape': (2, 3)}"), F4x6),
    ("descr_in_another_string.npy", "the real descr (double-quoted key) is a record of int8 whose field name holds \"'descr': '|u1'\"", npy("{\"descr\": [(\"'descr': '|u1', \", '|i1')], 'fortran_order': False, 'shape': (6,)}"), bytes(range(6))),
    ("fortran_matrix.npy", "fortran_order True of shape (2, 3): NumPy transposes, ptefs does not", npy(d(fortran="True")), F4x6),
    ("structured.npy", "a record dtype", npy(d("[('a', '<f4')]", shape="(6,)")), F4x6),
    ("subarray_descr.npy", "descr '2f4': a sub-array of 2 floats per item", npy(d("'2f4'", shape="(3,)")), F4x6),
    ("descr_escape.npy", "descr '<f\\x34' (an escape for '<f4')", npy(d("'<f\\x34'")), F4x6),
    ("descr_name.npy", "descr 'float32'", npy(d("'float32'")), F4x6),
    ("descr_leading_zero.npy", "descr 'f04', which NumPy reads as f4", npy(d("'f04'")), F4x6),
    ("longdouble.npy", "descr 'f16': long double, no tensor type", npy(d("'<f16'", shape="(1,)")), bytes(16)),
    ("concatenated_key.npy", "the key written 'de' 'scr' (implicit concatenation)", npy("{'de' 'scr': '<f4', 'fortran_order': False, 'shape': (2, 3)}"), F4x6),
    ("prefixed_key.npy", "the key written u'descr'", npy("{u'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}"), F4x6),
    ("comment.npy", "a comment after the dict", npy(d() + " # note"), F4x6),
    ("parenthesized_bool.npy", "fortran_order (False)", npy(d(fortran="(False)")), F4x6),
    ("bool_dim.npy", "a dimension True", npy(d(shape="(True, 6)")), F4x6),
    ("zero_zero_dim.npy", "a dimension 00 (zero, in Python 3)", npy(d(shape="(00,)")), b""),
    ("leading_newline.npy", "a newline before the dict", npy("\n" + d()), F4x6),
    ("trailing_data.npy", "4 bytes after the data, which NumPy ignores", npy(d()), F4x6 + b"\0\0\0\0"),
]

# Headers whose text is not a dict padded the usual way (their entries above hold None).
def nul_padded():
    body = d().encode()
    body = body + b"\0" * (128 - 10 - len(body) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


def indented_after():
    body = d().encode() + b"\n  "
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


UNPADDED = {"nul_padding.npy": nul_padded, "indented_after.npy": indented_after}


# safetensors: (file, description, header text or bytes, data bytes)
def st(header, data=b"", length=None):
    h = header.encode() if isinstance(header, str) else header
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + data


def entry(dtype="U8", shape="[2]", offsets="[0,2]", extra=""):
    return '{"dtype":"%s","shape":%s,"data_offsets":%s%s}' % (dtype, shape, offsets, extra)


ST = [
    ("plain.safetensors", "one U8 tensor, as save_file writes it (padded to 8)", st('{"a":%s}      ' % entry(), b"xy")),
    ("with_metadata.safetensors", "metadata and two tensors", st('{"__metadata__":{"format":"pt"},"a":%s,"b":%s}' % (entry(), entry("F32", "[1]", "[2,6]")), b"xy" + struct.pack("<f", 1.5))),
    ("out_of_order.safetensors", "entries listed in another order than their offsets", st('{"b":%s,"a":%s}' % (entry("I16", "[1]", "[2,4]"), entry()), b"xyzw")),
    ("array_entry.safetensors", "an entry as an array in field order", st('{"a":["U8",[2],[0,2]]}', b"xy")),
    ("enum_object_dtype.safetensors", "dtype in serde's enum form {\"U8\": null}", st('{"a":{"dtype":{"U8":null},"shape":[2],"data_offsets":[0,2]}}', b"xy")),
    ("extra_field.safetensors", "an unknown field in an entry, ignored", st('{"a":%s}' % entry(extra=',"note":[1,{"k":null}]'), b"xy")),
    ("null_metadata.safetensors", "__metadata__ null", st('{"__metadata__":null,"a":%s}' % entry(), b"xy")),
    ("metadata_key_twice.safetensors", "a key twice inside __metadata__ (nothing reads it)", st('{"__metadata__":{"k":"1","k":"2"},"a":%s}' % entry(), b"xy")),
    ("escaped_names.safetensors", "a name and a field name written with \\u escapes", st('{"\\u0061":{"\\u0064type":"U8","shape":[2],"data_offsets":[0,2]}}', b"xy")),
    ("empty_tensors.safetensors", "two zero-byte tensors at the same offset", st('{"a":%s,"b":%s}' % (entry(shape="[0]", offsets="[0,0]"), entry(shape="[3,0]", offsets="[0,0]")))),
    ("f4_packed.safetensors", "4-bit F4: 4 elements in 2 bytes", st('{"a":%s}' % entry("F4", "[4]"), b"xy")),
    ("e8m0.safetensors", "F8_E8M0", st('{"a":%s}' % entry("F8_E8M0"), b"xy")),
    ("bf16.safetensors", "BF16 (2,)", st('{"a":%s}' % entry("BF16", "[2]", "[0,4]"), b"\x80\x3f\x00\x40")),
    ("no_tensors.safetensors", "an empty object", st("{}")),
    ("whitespace.safetensors", "whitespace around and inside the JSON", st(' \n{ "a" : %s }\t ' % entry(), b"xy")),
    # Refused by both.
    ("field_twice.safetensors", "dtype twice in one entry (I8 then U8)", st('{"a":{"dtype":"I8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"xy")),
    ("offsets_twice.safetensors", "data_offsets twice in one entry", st('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,1],"data_offsets":[0,2]}}', b"xy")),
    ("metadata_twice.safetensors", "__metadata__ twice", st('{"__metadata__":{},"__metadata__":{},"a":%s}' % entry(), b"xy")),
    ("metadata_number.safetensors", "a metadata value that is a number", st('{"__metadata__":{"k":1},"a":%s}' % entry(), b"xy")),
    ("unknown_dtype.safetensors", "dtype F33", st('{"a":%s}' % entry("F33"), b"xy")),
    ("lowercase_dtype.safetensors", "dtype u8", st('{"a":%s}' % entry("u8"), b"xy")),
    ("missing_field.safetensors", "no shape", st('{"a":{"dtype":"U8","data_offsets":[0,2]}}', b"xy")),
    ("overlap.safetensors", "offsets that overlap by a byte", st('{"a":%s,"b":%s}' % (entry(), entry(offsets="[1,3]")), b"xyz")),
    ("gap.safetensors", "a byte between two tensors", st('{"a":%s,"b":%s}' % (entry(), entry(offsets="[3,5]")), b"xyzwv")),
    ("short_data.safetensors", "one byte of data missing", st('{"a":%s}' % entry(), b"x")),
    ("trailing_data.safetensors", "one byte after the data", st('{"a":%s}' % entry(), b"xyz")),
    ("size_mismatch.safetensors", "F32 (2,) over 4 bytes", st('{"a":%s}' % entry("F32", "[2]", "[0,4]"), b"xyzw")),
    ("f4_odd.safetensors", "3 F4 elements: not a whole number of bytes", st('{"a":%s}' % entry("F4", "[3]"), b"xy")),
    ("size_overflow.safetensors", "a shape whose element count overflows 64 bits", st('{"a":%s}' % entry("U8", "[4294967296,4294967296,2,0]", "[0,0]"))),
    ("end_before_begin.safetensors", "data_offsets [2, 0]", st('{"a":%s}' % entry(shape="[0]", offsets="[2,0]"), b"xy")),
    ("three_offsets.safetensors", "data_offsets of three numbers", st('{"a":%s}' % entry(offsets="[0,2,2]"), b"xy")),
    ("float_dim.safetensors", "a dimension 2.0", st('{"a":%s}' % entry(shape="[2.0]"), b"xy")),
    ("negative_zero.safetensors", "an offset -0", st('{"a":%s}' % entry(offsets="[-0,2]"), b"xy")),
    ("negative_dim.safetensors", "a dimension -2", st('{"a":%s}' % entry(shape="[-2]"), b"xy")),
    ("deep_extra.safetensors", "an ignored field nested 200 deep", st('{"a":%s}' % entry(extra=',"x":' + "[" * 200 + "]" * 200), b"xy")),
    ("surrogate_extra.safetensors", "an ignored field holding a lone surrogate escape", st('{"a":%s}' % entry(extra=',"x":"\\ud800"'), b"xy")),
    ("huge_number_extra.safetensors", "an ignored field holding 1e400", st('{"a":%s}' % entry(extra=',"x":1e400'), b"xy")),
    ("top_array.safetensors", "a JSON array, not an object", st("[1]      ")),
    ("nul_padding.safetensors", "padded with NUL bytes", st(b'{}\0\0\0\0\0\0')),
    ("bom.safetensors", "a UTF-8 byte order mark before the JSON", st(b'\xef\xbb\xbf{}')),
    ("not_utf8.safetensors", "a name with an invalid UTF-8 byte", st(b'{"\xff":' + entry().encode() + b"}", b"xy")),
    ("length_past_end.safetensors", "the header length reaches past the end of the file", st('{"a":%s}' % entry(), b"xy", length=200)),
    ("length_over_limit.safetensors", "a header length of 100000001, over the format's limit", st("{}", length=100_000_001)),
    ("text.safetensors", "a text file", b"hello world, this is not a model\n"),
    ("too_short.safetensors", "3 bytes", b"abc"),
    # The library accepts; ptefs refuses.
    ("name_twice.safetensors", "the same tensor twice, identical entries: the library keeps the last", st('{"a":%s,"a":%s}' % (entry(), entry()), b"xy")),
]


def main():
    npy_dir = os.path.join(HERE, "npy")
    st_dir = os.path.join(HERE, "safetensors")
    for folder in (npy_dir, st_dir):
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
    lines = []
    for name, what, header, data in NPY:
        raw = (UNPADDED[name]() if header is None else header) + data
        with open(os.path.join(npy_dir, name), "wb") as f:
            f.write(raw)
        lines.append(f"- `{name}`: {what}")
    with open(os.path.join(npy_dir, "README.md"), "w") as f:
        f.write("# .npy corpus\n\nHostile and edge-case `.npy` files for `tests/corpus.rs`, which reads each with\n"
                "ptefs and with NumPy and checks that they agree (or that ptefs refuses, where the\n"
                "test's table says why). Written by `../generate.py`.\n\n" + "\n".join(lines) + "\n")
    lines = []
    for name, what, raw in ST:
        with open(os.path.join(st_dir, name), "wb") as f:
            f.write(raw)
        lines.append(f"- `{name}`: {what}")
    with open(os.path.join(st_dir, "README.md"), "w") as f:
        f.write("# safetensors corpus\n\nHostile and edge-case safetensors files for `tests/corpus.rs`, which reads each\n"
                "with ptefs and with the `safetensors` package and checks that they agree (or that\n"
                "ptefs refuses, where the test's table says why). Written by `../generate.py`.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
