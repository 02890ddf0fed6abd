#!/usr/bin/env python3
"""Renders rustdoc's JSON output (format 57, Rust 1.95) as the crate's public API: one
line per public item with its signature, sorted.

    public-api.py CRATE.json > listing

Every path an item is reachable by is listed (a re-export gives a second line). Listed:
modules, structs (`{ .. }` when some fields are private) and their public fields, enums
and their variants, traits and their items, functions, methods of inherent impls,
constants and statics with their values, type aliases, macros, re-exports of other
crates' items, trait impls written in the crate (each once, with its own Self type, also
impls of the crate's traits for other crates' types, such as `Arc<O>`), and the auto
traits (Send, Sync, Unpin, UnwindSafe, RefUnwindSafe) each type has or lacks. Any item
kind, type kind or JSON format it does not know stops it with an error: nothing is left
out silently. Not listed: `#[doc(hidden)]` items (rustdoc leaves them out of its JSON;
`quorumlock::__private` is not API), private items, blanket impls (`impl<T> From<T> for
T` and the like, the same for every type), and the unstable auto traits (Freeze,
UnsafeUnpin).
"""

import json
import sys

FORMAT = 57  # rustdoc JSON format_version this renderer reads (Rust 1.95)
STABLE_AUTO = {"Send", "Sync", "Unpin", "UnwindSafe", "RefUnwindSafe"}


class Api:
    def __init__(self, doc):
        self.ix = doc["index"]
        self.paths = doc["paths"]
        self.root = str(doc["root"])
        self.public = {}  # local id -> public paths (lists of segments)
        self.lines = set()
        self.foreign = []  # re-exports of other crates' items
        self.seen_impls = set()

    def item(self, id_):
        return self.ix.get(str(id_))

    # ---- where each local item can be named from outside ----

    def collect(self, mod_id, path, seen):
        if mod_id in seen:
            return
        seen = seen | {mod_id}
        for child in self.item(mod_id)["inner"]["module"]["items"]:
            it = self.item(child)
            if it is None or it["visibility"] != "public":
                continue
            kind, inner = next(iter(it["inner"].items()))
            if kind == "use":
                target = inner["id"]
                if target is None or self.item(target) is None:
                    # Another crate's item (or module, glob) re-exported here: it is
                    # part of this crate's surface, shown by the path it comes from.
                    glob = "::*" if inner["is_glob"] else ""
                    self.foreign.append(f"pub use {'::'.join(path + [inner['name']])}"
                                        f"{glob} = {inner['source']}{glob}")
                    continue
                if inner["is_glob"]:
                    self.collect(str(target), path, seen)
                    continue
                name, child = inner["name"], str(target)
                it = self.item(child)
            else:
                name = it["name"]
            if it is None or it["crate_id"] != 0:
                continue
            here = path + [name]
            self.public.setdefault(str(child), []).append(here)
            if "module" in it["inner"]:
                self.collect(str(child), here, seen)

    def name_of(self, id_, written):
        """The path a type or trait is shown by: its shortest public path if it is this
        crate's, else the path rustdoc knows (another crate's, e.g. core::time::Duration)."""
        ps = self.public.get(str(id_))
        if ps:
            return "::".join(min(ps, key=lambda p: (len(p), p)))
        if str(id_) in self.paths:
            return "::".join(self.paths[str(id_)]["path"])
        return written

    # ---- types ----

    def args(self, a):
        if a is None:
            return ""
        if "angle_bracketed" in a:
            ab = a["angle_bracketed"]
            parts = [self.generic_arg(x) for x in ab["args"]]
            parts += [self.constraint(c) for c in ab["constraints"]]
            return "<" + ", ".join(parts) + ">" if parts else ""
        if "parenthesized" in a:
            p = a["parenthesized"]
            out = "(" + ", ".join(self.ty(t) for t in p["inputs"]) + ")"
            if p["output"] is not None:
                out += " -> " + self.ty(p["output"])
            return out
        return "(..)"  # return_type_notation

    def generic_arg(self, x):
        if "lifetime" in x:
            return x["lifetime"]
        if "type" in x:
            return self.ty(x["type"])
        if "const" in x:
            return x["const"]["expr"]
        return "_"

    def constraint(self, c):
        b = c["binding"]
        if "equality" in b:
            term = b["equality"]
            val = self.ty(term["type"]) if "type" in term else term["constant"]["expr"]
            return f"{c['name']}{self.args(c['args'])} = {val}"
        return f"{c['name']}{self.args(c['args'])}: {self.bounds(b['constraint'])}"

    def path(self, p):
        return self.name_of(p["id"], p["path"]) + self.args(p["args"])

    def bounds(self, bs):
        out = []
        for b in bs:
            if "trait_bound" in b:
                tb = b["trait_bound"]
                hr = self.hrtb(tb["generic_params"])
                mod = {"none": "", "maybe": "?", "maybe_const": "~const "}[tb["modifier"]]
                out.append(hr + mod + self.path(tb["trait"]))
            elif "outlives" in b:
                out.append(b["outlives"])
            else:
                out.append("use<" + ", ".join(map(str, b["use"])) + ">")
        return " + ".join(out)

    def hrtb(self, params):
        return "for<" + ", ".join(p["name"] for p in params) + "> " if params else ""

    def ty(self, t):
        (kind, v), = t.items()
        if kind == "resolved_path":
            return self.path(v)
        if kind == "dyn_trait":
            s = " + ".join(self.hrtb(pt["generic_params"]) + self.path(pt["trait"])
                           for pt in v["traits"])
            return "dyn " + s + (" + " + v["lifetime"] if v["lifetime"] else "")
        if kind in ("generic", "primitive"):
            return v
        if kind == "function_pointer":
            h = v["header"]
            ins = ", ".join(self.ty(x[1]) for x in v["sig"]["inputs"])
            out = f" -> {self.ty(v['sig']['output'])}" if v["sig"]["output"] else ""
            return f"{self.hrtb(v['generic_params'])}{self.header(h)}fn({ins}){out}"
        if kind == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ("," if len(v) == 1 else "") + ")"
        if kind == "slice":
            return f"[{self.ty(v)}]"
        if kind == "array":
            return f"[{self.ty(v['type'])}; {v['len']}]"
        if kind == "pat":
            return self.ty(v["type"]) + " is " + v["__pat_unstable_do_not_use"]
        if kind == "impl_trait":
            return "impl " + self.bounds(v)
        if kind == "infer":
            return "_"
        if kind == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(v["type"])
        if kind == "borrowed_ref":
            lt = v["lifetime"] + " " if v["lifetime"] else ""
            return "&" + lt + ("mut " if v["is_mutable"] else "") + self.ty(v["type"])
        if kind == "qualified_path":
            tr = f" as {self.path(v['trait'])}" if v["trait"] else ""
            return f"<{self.ty(v['self_type'])}{tr}>::{v['name']}{self.args(v['args'])}"
        raise SystemExit(f"public-api.py: unknown type kind {kind!r} (rustdoc JSON format changed?)")

    # ---- generics, headers ----

    def params(self, g):
        out = []
        for p in g["params"]:
            k = p["kind"]
            if "lifetime" in k:
                out.append(p["name"] + (": " + " + ".join(k["lifetime"]["outlives"])
                                         if k["lifetime"]["outlives"] else ""))
            elif "type" in k:
                if k["type"]["is_synthetic"]:
                    continue  # `impl Trait` in argument position: shown in the argument
                s = p["name"]
                if k["type"]["bounds"]:
                    s += ": " + self.bounds(k["type"]["bounds"])
                if k["type"]["default"] is not None:
                    s += " = " + self.ty(k["type"]["default"])
                out.append(s)
            else:
                c = k["const"]
                out.append(f"const {p['name']}: {self.ty(c['type'])}"
                           + (f" = {c['default']}" if c["default"] else ""))
        return "<" + ", ".join(out) + ">" if out else ""

    def where(self, g):
        out = []
        for w in g["where_predicates"]:
            if "bound_predicate" in w:
                b = w["bound_predicate"]
                out.append(self.hrtb(b["generic_params"]) + self.ty(b["type"]) + ": "
                           + self.bounds(b["bounds"]))
            elif "lifetime_predicate" in w:
                lp = w["lifetime_predicate"]
                out.append(lp["lifetime"] + ": " + " + ".join(lp["outlives"]))
            else:
                e = w["eq_predicate"]
                rhs = e["rhs"]
                out.append(self.ty(e["lhs"]) + " = "
                           + (self.ty(rhs["type"]) if "type" in rhs else rhs["constant"]["expr"]))
        return " where " + ", ".join(out) if out else ""

    def header(self, h):
        s = ""
        if h["is_const"]:
            s += "const "
        if h["is_async"]:
            s += "async "
        if h["is_unsafe"]:
            s += "unsafe "
        abi = h["abi"]
        if abi != "Rust":
            s += 'extern "' + (abi if isinstance(abi, str) else next(iter(abi))) + '" '
        return s

    def fn(self, name, f):
        sig = f["sig"]
        ins = []
        for arg, t in sig["inputs"]:
            if arg == "self":
                ins.append(self.self_arg(t))
            else:
                ins.append(f"{arg}: {self.ty(t)}")
        out = f" -> {self.ty(sig['output'])}" if sig["output"] is not None else ""
        return (f"{self.header(f['header'])}fn {name}{self.params(f['generics'])}"
                f"({', '.join(ins)}){out}{self.where(f['generics'])}")

    def self_arg(self, t):
        s = self.ty(t)
        return {"Self": "self", "&Self": "&self", "&mut Self": "&mut self"}.get(s, "self: " + s)

    @staticmethod
    def attrs(it):
        out = []
        for a in it["attrs"]:
            if a == "non_exhaustive":
                out.append("#[non_exhaustive] ")
        return "".join(out)

    # ---- items ----

    def emit(self, s):
        self.lines.add(s)

    def render(self):
        for id_, paths in self.public.items():
            for p in paths:
                self.render_item(self.item(id_), "::".join(p))

    def render_item(self, it, path):
        kind, v = next(iter(it["inner"].items()))
        a = self.attrs(it)
        if kind == "module":
            self.emit(f"pub mod {path}")
        elif kind == "function":
            self.emit(f"pub {self.fn(path, v)}")
        elif kind == "constant":
            self.emit(f"pub const {path}: {self.ty(v['type'])} = {self.const_value(it, v['const'])}")
        elif kind == "static":
            self.emit(f"pub static {'mut ' if v['is_mutable'] else ''}{path}: {self.ty(v['type'])}"
                      f" = {v['expr']}")
        elif kind == "type_alias":
            self.emit(f"pub type {path}{self.params(v['generics'])} = {self.ty(v['type'])}")
        elif kind in ("macro", "proc_macro"):
            self.emit(f"pub macro {path}!")
        elif kind == "struct":
            g = v["generics"]
            k = v["kind"]
            shape = ""
            if "plain" in k and k["plain"]["has_stripped_fields"]:
                shape = " { .. }"  # private or hidden fields: no struct literal outside
            elif k == "unit":
                shape = ";"
            elif "tuple" in k:
                shape = "(" + ", ".join(
                    self.ty(self.item(f)["inner"]["struct_field"]) if f is not None else "_"
                    for f in k["tuple"]) + ")"
            self.emit(f"{a}pub struct {path}{self.params(g)}{shape}{self.where(g)}")
            if "plain" in k:
                for f in k["plain"]["fields"]:
                    fi = self.item(f)
                    self.emit(f"pub {path}::{fi['name']}: {self.ty(fi['inner']['struct_field'])}")
            self.impls(path, g, v["impls"])
        elif kind == "enum":
            g = v["generics"]
            hidden = " { .. }" if v["has_stripped_variants"] else ""
            self.emit(f"{a}pub enum {path}{self.params(g)}{self.where(g)}{hidden}")
            for var in v["variants"]:
                self.variant(path, self.item(var))
            self.impls(path, g, v["impls"])
        elif kind == "union":
            g = v["generics"]
            self.emit(f"{a}pub union {path}{self.params(g)}{self.where(g)}")
            self.impls(path, g, v["impls"])
        elif kind == "trait":
            g = v["generics"]
            b = ": " + self.bounds(v["bounds"]) if v["bounds"] else ""
            un = "unsafe " if v["is_unsafe"] else ""
            self.emit(f"pub {un}trait {path}{self.params(g)}{b}{self.where(g)}")
            for m in v["items"]:
                self.assoc(path, self.item(m), in_trait=True)
            # Impls of this trait, also for other crates' types (`impl Observer for Arc<O>`).
            self.impls(path, g, v["implementations"])
        else:
            raise SystemExit(f"public-api.py: unknown item kind {kind!r} at {path}")

    @staticmethod
    def const_value(it, c):
        """A constant's value: rustdoc's evaluated value, else its literal expression, else
        (an expression rustdoc does not show, e.g. `Duration::from_secs(..)`) the source
        text after `=`, so that a changed value changes the listing too."""
        if c.get("value") is not None:
            return c["value"]
        if c["expr"] != "_":
            return c["expr"]
        sp = it["span"]
        with open(sp["filename"]) as f:
            lines = f.read().split("\n")[sp["begin"][0] - 1:sp["end"][0]]
        text = " ".join(l.strip() for l in lines)
        if "=" not in text:
            raise SystemExit(f"public-api.py: no value for constant {it['name']} at "
                             f"{sp['filename']}:{sp['begin'][0]}")
        return text.split("=", 1)[1].strip().rstrip(";").strip()

    def variant(self, path, it):
        v = it["inner"]["variant"]
        k = v["kind"]
        a = self.attrs(it)
        if k == "plain":
            d = f" = {v['discriminant']['expr']}" if v["discriminant"] else ""
            self.emit(f"{a}pub {path}::{it['name']}{d}")
        elif "tuple" in k:
            fs = ", ".join(self.ty(self.item(f)["inner"]["struct_field"]) if f is not None else "_"
                           for f in k["tuple"])
            self.emit(f"{a}pub {path}::{it['name']}({fs})")
        else:
            self.emit(f"{a}pub {path}::{it['name']}" + (" { .. }" if k["struct"]["has_stripped_fields"] else ""))
            for f in k["struct"]["fields"]:
                fi = self.item(f)
                self.emit(f"pub {path}::{it['name']}::{fi['name']}: {self.ty(fi['inner']['struct_field'])}")

    def assoc(self, owner, it, in_trait):
        kind, v = next(iter(it["inner"].items()))
        name = f"{owner}::{it['name']}"
        pub = "" if in_trait else "pub "
        if kind == "function":
            provided = " (provided)" if in_trait and v["has_body"] else ""
            self.emit(f"{pub}{self.fn(name, v)}{provided}")
        elif kind == "assoc_const":
            val = f" = {v['value']}" if v.get("value") else ""
            self.emit(f"{pub}const {name}: {self.ty(v['type'])}{val}")
        elif kind == "assoc_type":
            b = ": " + self.bounds(v["bounds"]) if v["bounds"] else ""
            t = " = " + self.ty(v["type"]) if v["type"] else ""
            self.emit(f"{pub}type {name}{self.params(v['generics'])}{b}{t}")
        else:
            raise SystemExit(f"public-api.py: unknown associated item {kind!r} at {name}")

    def impls(self, path, g, ids):
        for i in ids:
            it = self.item(i)
            im = it["inner"]["impl"]
            if im["blanket_impl"] is not None:
                continue
            ig = im["generics"]
            if im["trait"] is None:  # inherent: its public items, under this path
                for m in im["items"]:
                    mi = self.item(m)
                    if mi is not None and mi["visibility"] == "public":
                        self.assoc(path, mi, in_trait=False)
                continue
            # A trait impl is listed once, with its own Self type (rustdoc also files
            # `impl From<A> for B` under A), and not when Self is a private type.
            if i in self.seen_impls:
                continue
            self.seen_impls.add(i)
            me = self.ty(im["for"])
            fid = im["for"].get("resolved_path", {}).get("id")
            if fid is not None and self.item(fid) is not None and str(fid) not in self.public:
                continue
            tr = ("!" if im["is_negative"] else "") + self.path(im["trait"])
            if im["is_synthetic"]:
                if im["trait"]["path"].split("::")[-1] not in STABLE_AUTO:
                    continue
                tr = "auto " + tr
            un = "unsafe " if im["is_unsafe"] else ""
            self.emit(f"{un}impl{self.params(ig)} {tr} for {me}{self.where(ig)}")
            # The trait's items are the trait's; only associated types and consts chosen
            # here are part of this impl's surface.
            for m in im["items"]:
                mi = self.item(m)
                if mi is not None and ("assoc_type" in mi["inner"] or "assoc_const" in mi["inner"]):
                    kind, v = next(iter(mi["inner"].items()))
                    if kind == "assoc_type":
                        val = self.ty(v["type"]) if v.get("type") else "_"
                    else:
                        val = v.get("value") or "_"
                    self.emit(f"impl {tr} for {me}: {'type' if kind == 'assoc_type' else 'const'} "
                              f"{mi['name']} = {val}")


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    if doc["format_version"] != FORMAT:
        # A format this renderer was not written against may drop or move fields (the
        # attributes, a new item kind) and so leave items out without an error: stop.
        raise SystemExit(
            f"public-api.py: rustdoc JSON format {doc['format_version']} (from `rustc "
            f"--version`), this renderer knows {FORMAT} (Rust 1.95). Update "
            "scripts/public-api.py for the new format (rustdoc-types' changelog lists "
            "the changes), check that the listing of an unchanged tree is unchanged, "
            "then set FORMAT.")
    api = Api(doc)
    api.public[api.root] = [[api.item(api.root)["name"]]]
    api.collect(api.root, [api.item(api.root)["name"]], frozenset())
    api.render()
    api.lines.update(api.foreign)
    print("\n".join(sorted(api.lines)))


if __name__ == "__main__":
    main()
