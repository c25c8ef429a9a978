#!/usr/bin/env python3
"""Check compiled .proto files against the markdown fact tables of a spec.

The spec (--spec) is a markdown file. Only the lines below are read; all other
lines are prose and skipped, except that any heading ("#", "##", ...) ends the
current message or service, and that prose naming an option extension declares
it (see the last item).

  **service Name**
      Starts a service; "(alpha)" may follow. A prose line naming
      "Service `pkg.Name`" starts one too. The service's table follows:
  | rpc | request | response | notes |
      One row per rpc. Request and response are message names; "stream X"
      marks a streaming side. Notes may say "alpha".
  **message Outer.Inner**
      Starts a message; "(alpha)" may follow. Nested messages are named with
      dots. The message's table follows:
  | # | field | type | label | notes |
      One row per field: the number; the name; the type (a scalar such as
      uint64, a message or enum name, or map<K,V>); the label (empty,
      "repeated" or "optional"; empty for maps); notes, any of "oneof X",
      "secret", "alpha".
  **enum Outer.E**: A=0, B=1(alpha)
      An enum with all its values on one line; "(alpha)" after the name or
      after a value marks it. Any other parenthesised note closing the line
      (e.g. "(top level)") is prose.
  `name` = 1059 on FieldOptions
      In a prose paragraph that mentions "Options": a custom option extension
      and its number.

A table is read when its first row is one of the two headers above (tables
with any other header are ignored); separator rows (|---|) are skipped, and
any line that is not a table row ends the table. A table belongs to the last
**message** or service line above it, with no heading or enum line between;
a field or rpc table without one, and a service without an rpc table, are
spec errors. Backticks in cells are ignored, and type names may carry the
package prefix (--package). With --appendix-only, reading starts at the first
"## Appendix" heading. A small example:

  **service Identity**
  | rpc | request | response | notes |
  |---|---|---|---|
  | GetPluginInfo | GetPluginInfoRequest | GetPluginInfoResponse |  |

  **message GetPluginInfoResponse**
  | # | field | type | label | notes |
  |---|---|---|---|---|
  | 1 | name | string |  |  |
  | 3 | manifest | map<string,string> |  |  |

  **enum PoolServiceState**: Creating=0, Ready=1

All `.proto` files under <root>/proto (except google/protobuf/**) are compiled
with `protoc -Iproto --include_imports -o <tmp>.pb ...`; the descriptors of the
requested package are compared with the facts:

  * every service/rpc (request, response, client/server streaming, alpha),
  * every message and nested message (alpha), every field (number, name,
    type, repeated/optional/map, oneof membership, secret/alpha markers),
  * every enum and enum value (number, alpha),
  * custom option extensions named in the prose ("`x` = 1059 on FieldOptions"),
  * and that the package defines nothing the facts do not list.  With
    --allow-extra, unlisted messages/enums/services/rpcs/extensions are only
    warnings (extra fields or enum values inside a listed type stay errors).

secret/alpha markers are read from the raw option bytes using the numbers of
the extensions declared in the compiled files (csi_secret, alpha_field,
alpha_message, alpha_method, alpha_service, alpha_enum, alpha_enum_value).
If the package declares none of them, marker checks are skipped unless the
facts use a marker.

Exit status: 0 = no mismatches, 1 = mismatches, 2 = usage/compile/spec error.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

try:
    from google.protobuf import descriptor_pb2
except ImportError:  # pragma: no cover
    sys.stderr.write("error: the 'protobuf' Python package is required (pip install protobuf)\n")
    sys.exit(2)

FDP = descriptor_pb2.FieldDescriptorProto

SCALAR_NAMES = {
    FDP.TYPE_DOUBLE: "double",
    FDP.TYPE_FLOAT: "float",
    FDP.TYPE_INT64: "int64",
    FDP.TYPE_UINT64: "uint64",
    FDP.TYPE_INT32: "int32",
    FDP.TYPE_FIXED64: "fixed64",
    FDP.TYPE_FIXED32: "fixed32",
    FDP.TYPE_BOOL: "bool",
    FDP.TYPE_STRING: "string",
    FDP.TYPE_BYTES: "bytes",
    FDP.TYPE_UINT32: "uint32",
    FDP.TYPE_SFIXED32: "sfixed32",
    FDP.TYPE_SFIXED64: "sfixed64",
    FDP.TYPE_SINT32: "sint32",
    FDP.TYPE_SINT64: "sint64",
}

# marker kind -> (extension name, extendee)
MARKER_EXT = {
    ("field", "secret"): ("csi_secret", ".google.protobuf.FieldOptions"),
    ("field", "alpha"): ("alpha_field", ".google.protobuf.FieldOptions"),
    ("message", "alpha"): ("alpha_message", ".google.protobuf.MessageOptions"),
    ("method", "alpha"): ("alpha_method", ".google.protobuf.MethodOptions"),
    ("service", "alpha"): ("alpha_service", ".google.protobuf.ServiceOptions"),
    ("enum", "alpha"): ("alpha_enum", ".google.protobuf.EnumOptions"),
    ("enum_value", "alpha"): ("alpha_enum_value", ".google.protobuf.EnumValueOptions"),
}
EXT_EXTENDEE = {name: extendee for (name, extendee) in MARKER_EXT.values()}


# ---------------------------------------------------------------------------
# Spec parsing
# ---------------------------------------------------------------------------

class SpecError(Exception):
    pass


class Facts:
    def __init__(self):
        self.services = {}    # name -> {"alpha": bool, "rpcs": {rpc: dict}, "line": n}
        self.messages = {}    # qualname -> {"alpha": bool, "fields": {num: dict}, "line": n}
        self.enums = {}       # qualname -> {"alpha": bool, "values": {name: (num, alpha)}, "line": n}
        self.extensions = {}  # name -> (number, extendee or None, line)


def _cells(line):
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|"):
        s = s[:-1]
    return [c.strip().replace("`", "").strip() for c in s.split("|")]


def _is_sep(cells):
    return all(re.fullmatch(r":?-{2,}:?", c) for c in cells if c) and any(cells)


def _norm_type(t, package):
    t = re.sub(r"\s+", "", t.replace("`", ""))
    m = re.fullmatch(r"map<([^,]+),(.+)>", t)
    if m:
        return "map<%s,%s>" % (_norm_type(m.group(1), package), _norm_type(m.group(2), package))
    t = t.lstrip(".")
    if package and t.startswith(package + "."):
        t = t[len(package) + 1:]
    return t


def _notes(notes):
    words = notes.replace(",", " ").split()
    oneof = None
    m = re.search(r"\boneof\s+(\w+)", notes)
    if m:
        oneof = m.group(1)
    return oneof, ("secret" in words), ("alpha" in words)


HEADER_RE = re.compile(r"^\*\*(service|message|enum)\s+([\w.]+)\*\*\s*(\(alpha\))?\s*(?::\s*(.*))?$")
PROSE_SERVICE_RE = re.compile(r"\b[Ss]ervice\s+`(?:[\w.]+\.)?(\w+)`")
EXT_RE = re.compile(r"((?:`\w+`\s*,?\s*)+)=\s*(\d+)")


def _scan_extensions(text, lineno, facts):
    if "Options" not in text:
        return
    for em in EXT_RE.finditer(text):
        for n in re.findall(r"`(\w+)`", em.group(1)):
            facts.extensions[n] = (int(em.group(2)), EXT_EXTENDEE.get(n), lineno)


def parse_spec(text, package, appendix_only):
    lines = text.splitlines()
    start = 0
    if appendix_only:
        for i, line in enumerate(lines):
            if re.match(r"^##\s+Appendix\b", line):
                start = i
                break
        else:
            raise SpecError("no '## Appendix' heading found")

    facts = Facts()
    cur_kind = None      # "message" | "service" | None
    cur_name = None
    table = None         # "fields" | "rpcs" | None
    table_owner = None

    def fail(lineno, msg):
        raise SpecError("line %d: %s" % (lineno, msg))

    for idx in range(start, len(lines)):
        lineno = idx + 1
        raw = lines[idx]
        line = raw.strip()

        if line.startswith("|"):
            cells = _cells(line)
            if table is None:
                head = [c.lower() for c in cells]
                if head[:5] == ["#", "field", "type", "label", "notes"]:
                    if cur_kind != "message":
                        fail(lineno, "field table without a preceding **message X** header")
                    table, table_owner = "fields", cur_name
                elif head[:3] == ["rpc", "request", "response"]:
                    if cur_kind != "service":
                        fail(lineno, "rpc table without a preceding service name")
                    table, table_owner = "rpcs", cur_name
                else:
                    table, table_owner = "other", None
                continue
            if _is_sep(cells) or table == "other":
                continue
            if table == "fields":
                if len(cells) < 4:
                    fail(lineno, "short field row: %r" % line)
                num_s, name, ftype, label = cells[0], cells[1], cells[2], cells[3]
                notes = cells[4] if len(cells) > 4 else ""
                if not re.fullmatch(r"\d+", num_s):
                    fail(lineno, "bad field number %r" % num_s)
                num = int(num_s)
                fields = facts.messages[table_owner]["fields"]
                if num in fields:
                    fail(lineno, "duplicate field number %d in %s" % (num, table_owner))
                oneof, secret, alpha = _notes(notes)
                fields[num] = {
                    "name": name,
                    "type": _norm_type(ftype, package),
                    "label": label.lower(),
                    "oneof": oneof,
                    "secret": secret,
                    "alpha": alpha,
                    "line": lineno,
                }
            elif table == "rpcs":
                if len(cells) < 3:
                    fail(lineno, "short rpc row: %r" % line)
                rpc, req, resp = cells[0], cells[1], cells[2]
                notes = cells[3] if len(cells) > 3 else ""
                cs = req.startswith("stream ")
                ss = resp.startswith("stream ")
                rpcs = facts.services[table_owner]["rpcs"]
                if rpc in rpcs:
                    fail(lineno, "duplicate rpc %s in %s" % (rpc, table_owner))
                rpcs[rpc] = {
                    "input": _norm_type(req[7:] if cs else req, package),
                    "output": _norm_type(resp[7:] if ss else resp, package),
                    "client_streaming": cs,
                    "server_streaming": ss,
                    "alpha": _notes(notes)[2],
                    "line": lineno,
                }
            continue

        # any non-table line ends a table
        if table is not None:
            table, table_owner = None, None
        if not line:
            continue

        if line.startswith("#"):
            cur_kind, cur_name = None, None
            continue

        m = HEADER_RE.match(line)
        if m:
            kind, name, alpha, rest = m.group(1), _norm_type(m.group(2), package), bool(m.group(3)), m.group(4)
            if kind == "message":
                if name in facts.messages:
                    fail(lineno, "message %s listed twice" % name)
                facts.messages[name] = {"alpha": alpha, "fields": {}, "line": lineno}
                cur_kind, cur_name = "message", name
            elif kind == "service":
                if name in facts.services:
                    fail(lineno, "service %s listed twice" % name)
                facts.services[name] = {"alpha": alpha, "rpcs": {}, "line": lineno}
                cur_kind, cur_name = "service", name
            else:
                if name in facts.enums:
                    fail(lineno, "enum %s listed twice" % name)
                values = {}
                # A closing note such as "(top level)" is prose, not a value.
                rest = re.sub(r"\s*\((?!alpha\))[^()]*\)\s*$", "", rest or "")
                for part in rest.split(","):
                    part = part.strip()
                    if not part:
                        continue
                    vm = re.fullmatch(r"(\w+)\s*=\s*(-?\d+)\s*(\(alpha\))?", part)
                    if not vm:
                        fail(lineno, "cannot parse enum value %r" % part)
                    vname, vnum = vm.group(1), int(vm.group(2))
                    if vname in values:
                        fail(lineno, "duplicate enum value %s in %s" % (vname, name))
                    values[vname] = (vnum, bool(vm.group(3)))
                if not values:
                    fail(lineno, "enum %s has no values" % name)
                facts.enums[name] = {"alpha": alpha, "values": values, "line": lineno}
                cur_kind, cur_name = None, None
            continue

        # prose
        m = PROSE_SERVICE_RE.search(line)
        if m and not line.startswith("**"):
            name = m.group(1)
            if name not in facts.services:
                facts.services[name] = {"alpha": False, "rpcs": {}, "line": lineno}
            cur_kind, cur_name = "service", name
            continue
        # other prose keeps the current header (e.g. a note between header and table)

    # option extensions named in prose paragraphs (wrapped lines joined), e.g.
    # "`csi_secret` = 1059 on FieldOptions"
    para, para_line = [], 0
    for idx in range(start, len(lines) + 1):
        line = lines[idx].strip() if idx < len(lines) else ""
        if line and not line.startswith(("|", "**", "#")):
            if not para:
                para_line = idx + 1
            if line.startswith(("- ", "* ")) and para:
                _scan_extensions(" ".join(para), para_line, facts)
                para, para_line = [], idx + 1
            para.append(line)
            continue
        if para:
            _scan_extensions(" ".join(para), para_line, facts)
            para = []

    for name, svc in facts.services.items():
        if not svc["rpcs"]:
            raise SpecError("line %d: service %s has no rpc table" % (svc["line"], name))
    return facts


# ---------------------------------------------------------------------------
# Descriptor side
# ---------------------------------------------------------------------------

def _read_varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def raw_option_fields(options_msg):
    """field number -> last varint value, from the serialized options
    (custom extensions unknown to the python pool survive as unknown fields)."""
    out = {}
    buf = options_msg.SerializeToString()
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _read_varint(buf, pos)
            out[num] = val
        elif wt == 1:
            pos += 8
        elif wt == 2:
            ln, pos = _read_varint(buf, pos)
            pos += ln
        elif wt == 5:
            pos += 4
        else:
            break  # groups are not used in options we care about
    return out


class Model:
    def __init__(self, fds, package):
        self.package = package
        self.files = [f for f in fds.file if f.package == package]
        self.messages = {}    # qualname -> DescriptorProto
        self.enums = {}       # qualname -> EnumDescriptorProto
        self.services = {}    # name -> ServiceDescriptorProto
        self.map_entries = {}  # full ".pkg.X.YEntry" -> DescriptorProto
        self.extensions = {}  # name -> FieldDescriptorProto
        self.all_marker_ext = {}  # extension name -> number (any file in the set)
        for f in fds.file:
            for ext in f.extension:
                if ext.name in EXT_EXTENDEE and ext.extendee == EXT_EXTENDEE[ext.name]:
                    self.all_marker_ext.setdefault(ext.name, ext.number)
        for f in self.files:
            prefix = "." + f.package if f.package else ""
            for m in f.message_type:
                self._add_message(m, "", prefix)
            for e in f.enum_type:
                self.enums[e.name] = e
            for s in f.service:
                self.services[s.name] = s
            for ext in f.extension:
                self.extensions[ext.name] = ext
        # prefer marker numbers declared in this package
        for name, ext in self.extensions.items():
            if name in EXT_EXTENDEE and ext.extendee == EXT_EXTENDEE[name]:
                self.all_marker_ext[name] = ext.number

    def _add_message(self, m, outer, prefix):
        qual = outer + "." + m.name if outer else m.name
        if m.options.map_entry:
            self.map_entries[prefix + "." + qual] = m
            return
        self.messages[qual] = m
        for n in m.nested_type:
            self._add_message(n, qual, prefix)
        for e in m.enum_type:
            self.enums[qual + "." + e.name] = e
        for ext in m.extension:
            self.extensions[qual + "." + ext.name] = ext

    def type_of(self, fld):
        if fld.type in (FDP.TYPE_MESSAGE, FDP.TYPE_ENUM, FDP.TYPE_GROUP):
            entry = self.map_entries.get(fld.type_name)
            if entry is not None and fld.label == FDP.LABEL_REPEATED:
                k = v = None
                for ef in entry.field:
                    if ef.number == 1:
                        k = self.type_of(ef)[0]
                    elif ef.number == 2:
                        v = self.type_of(ef)[0]
                return "map<%s,%s>" % (k, v), True
            return _norm_type(fld.type_name, self.package), False
        return SCALAR_NAMES.get(fld.type, "type%d" % fld.type), False

    def label_of(self, fld, is_map):
        if is_map:
            return ""
        if fld.label == FDP.LABEL_REPEATED:
            return "repeated"
        if fld.label == FDP.LABEL_REQUIRED:
            return "required"
        if fld.proto3_optional:
            return "optional"
        return ""

    def marker(self, kind, what, options):
        """True/False if the marker can be read, None if no such extension."""
        name = MARKER_EXT[(kind, what)][0]
        num = self.all_marker_ext.get(name)
        if num is None:
            return None
        return bool(raw_option_fields(options).get(num, 0))


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------

class Report:
    def __init__(self, package):
        self.package = package
        self.errors = []
        self.warnings = []

    def err(self, msg):
        self.errors.append(msg)
        print("MISMATCH %s: %s" % (self.package, msg))

    def warn(self, msg):
        self.warnings.append(msg)
        print("warning  %s: %s" % (self.package, msg))


def compare(facts, model, allow_extra, rep):
    counts = {"messages": 0, "fields": 0, "enum_values": 0, "rpcs": 0}
    extra = rep.warn if allow_extra else rep.err

    def check_marker(kind, what, where, options, expected):
        got = model.marker(kind, what, options)
        if got is None:
            if expected:
                rep.err("%s: facts mark it %s but no %s extension is declared"
                        % (where, what, MARKER_EXT[(kind, what)][0]))
            return
        if got != expected:
            rep.err("%s: %s marker is %s in proto, facts say %s"
                    % (where, what, "set" if got else "not set", "set" if expected else "not set"))

    # messages and fields
    for mname, mf in facts.messages.items():
        counts["messages"] += 1
        m = model.messages.get(mname)
        if m is None:
            rep.err("message %s (spec line %d) is missing" % (mname, mf["line"]))
            counts["fields"] += len(mf["fields"])
            continue
        check_marker("message", "alpha", "message %s" % mname, m.options, mf["alpha"])
        by_num = {f.number: f for f in m.field}
        for num, ff in sorted(mf["fields"].items()):
            counts["fields"] += 1
            where = "%s field %d (%s)" % (mname, num, ff["name"])
            f = by_num.get(num)
            if f is None:
                same_name = [x for x in m.field if x.name == ff["name"]]
                hint = " (proto has %s = %d)" % (ff["name"], same_name[0].number) if same_name else ""
                rep.err("%s is missing%s" % (where, hint))
                continue
            if f.name != ff["name"]:
                rep.err("%s: proto names it %s" % (where, f.name))
            ftype, is_map = model.type_of(f)
            if ftype != ff["type"]:
                rep.err("%s: type is %s in proto, facts say %s" % (where, ftype, ff["type"]))
            label = model.label_of(f, is_map)
            if label != ff["label"]:
                rep.err("%s: label is %r in proto, facts say %r" % (where, label, ff["label"]))
            oneof = None
            if f.HasField("oneof_index") and not f.proto3_optional:
                oneof = m.oneof_decl[f.oneof_index].name
            if oneof != ff["oneof"]:
                rep.err("%s: oneof is %s in proto, facts say %s" % (where, oneof, ff["oneof"]))
            check_marker("field", "secret", where, f.options, ff["secret"])
            check_marker("field", "alpha", where, f.options, ff["alpha"])
        for f in m.field:
            if f.number not in mf["fields"]:
                rep.err("%s has field %s = %d that the facts do not list" % (mname, f.name, f.number))

    for mname in sorted(model.messages):
        if mname not in facts.messages:
            extra("message %s is defined but not listed in the facts" % mname)

    # enums
    for ename, ef in facts.enums.items():
        e = model.enums.get(ename)
        if e is None:
            rep.err("enum %s (spec line %d) is missing" % (ename, ef["line"]))
            counts["enum_values"] += len(ef["values"])
            continue
        check_marker("enum", "alpha", "enum %s" % ename, e.options, ef["alpha"])
        by_name = {v.name: v for v in e.value}
        for vname, (vnum, valpha) in ef["values"].items():
            counts["enum_values"] += 1
            where = "enum %s value %s" % (ename, vname)
            v = by_name.get(vname)
            if v is None:
                rep.err("%s = %d is missing" % (where, vnum))
                continue
            if v.number != vnum:
                rep.err("%s: number is %d in proto, facts say %d" % (where, v.number, vnum))
            check_marker("enum_value", "alpha", where, v.options, valpha)
        for v in e.value:
            if v.name not in ef["values"]:
                rep.err("enum %s has value %s = %d that the facts do not list" % (ename, v.name, v.number))

    for ename in sorted(model.enums):
        if ename not in facts.enums:
            extra("enum %s is defined but not listed in the facts" % ename)

    # services
    for sname, sf in facts.services.items():
        s = model.services.get(sname)
        if s is None:
            rep.err("service %s (spec line %d) is missing" % (sname, sf["line"]))
            counts["rpcs"] += len(sf["rpcs"])
            continue
        check_marker("service", "alpha", "service %s" % sname, s.options, sf["alpha"])
        by_name = {r.name: r for r in s.method}
        for rname, rf in sf["rpcs"].items():
            counts["rpcs"] += 1
            where = "rpc %s.%s" % (sname, rname)
            r = by_name.get(rname)
            if r is None:
                rep.err("%s is missing" % where)
                continue
            got_in = _norm_type(r.input_type, model.package)
            got_out = _norm_type(r.output_type, model.package)
            if got_in != rf["input"]:
                rep.err("%s: request is %s in proto, facts say %s" % (where, got_in, rf["input"]))
            if got_out != rf["output"]:
                rep.err("%s: response is %s in proto, facts say %s" % (where, got_out, rf["output"]))
            if bool(r.client_streaming) != rf["client_streaming"]:
                rep.err("%s: request streaming is %s in proto, facts say %s"
                        % (where, bool(r.client_streaming), rf["client_streaming"]))
            if bool(r.server_streaming) != rf["server_streaming"]:
                rep.err("%s: response streaming is %s in proto, facts say %s"
                        % (where, bool(r.server_streaming), rf["server_streaming"]))
            check_marker("method", "alpha", where, r.options, rf["alpha"])
        for r in s.method:
            if r.name not in sf["rpcs"]:
                extra("rpc %s.%s is defined but not listed in the facts" % (sname, r.name))

    for sname in sorted(model.services):
        if sname not in facts.services:
            extra("service %s is defined but not listed in the facts" % sname)

    # option extensions named in the prose
    for xname, (xnum, xextendee, line) in facts.extensions.items():
        x = model.extensions.get(xname)
        if x is None:
            rep.err("extension %s = %d (spec line %d) is missing" % (xname, xnum, line))
            continue
        if x.number != xnum:
            rep.err("extension %s: number is %d in proto, facts say %d" % (xname, x.number, xnum))
        if xextendee and x.extendee != xextendee:
            rep.err("extension %s extends %s, expected %s" % (xname, x.extendee, xextendee))
        if x.type != FDP.TYPE_BOOL:
            rep.err("extension %s is not bool" % xname)
    for xname in sorted(model.extensions):
        if xname not in facts.extensions:
            extra("extension %s is defined but not listed in the facts" % xname)

    return counts


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def compile_protos(root, protoc, includes):
    proto_dir = os.path.join(root, "proto")
    files = []
    for dirpath, dirnames, filenames in os.walk(proto_dir):
        rel = os.path.relpath(dirpath, proto_dir).replace(os.sep, "/")
        if rel == "google/protobuf" or rel.startswith("google/protobuf/"):
            continue
        dirnames.sort()
        for fn in sorted(filenames):
            if fn.endswith(".proto"):
                files.append(os.path.relpath(os.path.join(dirpath, fn), root))
    if not files:
        raise RuntimeError("no .proto files under %s" % proto_dir)
    fd, out = tempfile.mkstemp(suffix=".pb")
    os.close(fd)
    try:
        cmd = [protoc, "-Iproto"] + ["-I" + i for i in includes] + ["--include_imports", "-o", out] + files
        proc = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise RuntimeError("protoc failed (%s):\n%s%s" % (" ".join(cmd), proc.stdout, proc.stderr))
        with open(out, "rb") as fh:
            data = fh.read()
    finally:
        os.unlink(out)
    return data, files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="markdown fact file")
    ap.add_argument("--package", required=True, help="protobuf package to check, e.g. csi.v1")
    ap.add_argument("--appendix-only", action="store_true",
                    help="parse only from the '## Appendix' heading on")
    ap.add_argument("--allow-extra", action="store_true",
                    help="unlisted messages/enums/services/rpcs/extensions are warnings, not errors")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="project root containing proto/ (default: parent of tools/)")
    ap.add_argument("--protoc", default=os.environ.get("PROTOC", "protoc"))
    ap.add_argument("-I", "--include", action="append", default=[],
                    help="extra include dir for protoc (well-known types)")
    ap.add_argument("--descriptor-set", help="use this FileDescriptorSet instead of running protoc")
    args = ap.parse_args(argv)

    try:
        with open(args.spec, encoding="utf-8") as fh:
            facts = parse_spec(fh.read(), args.package, args.appendix_only)
    except (OSError, SpecError) as e:
        print("error: spec %s: %s" % (args.spec, e), file=sys.stderr)
        return 2

    try:
        if args.descriptor_set:
            with open(args.descriptor_set, "rb") as fh:
                data = fh.read()
        else:
            data, _ = compile_protos(args.root, args.protoc, args.include)
    except (OSError, RuntimeError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2

    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(data)
    model = Model(fds, args.package)
    rep = Report(args.package)
    if not model.files:
        rep.err("no compiled .proto file declares package %s" % args.package)
    counts = compare(facts, model, args.allow_extra, rep)

    if rep.warnings:
        print("%s: %d warning(s) (extra definitions allowed by --allow-extra)"
              % (args.package, len(rep.warnings)))
    print("%s: %d mismatches (%d messages, %d fields, %d enum values, %d rpcs checked)"
          % (args.package, len(rep.errors), counts["messages"], counts["fields"],
             counts["enum_values"], counts["rpcs"]))
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
