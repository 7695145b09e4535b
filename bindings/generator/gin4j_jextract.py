#!/usr/bin/env python3
"""gin4j's stand-in for jextract: reads a jextract @argfile, parses the header(s) with
libclang (the engine jextract uses) and writes Java sources of jextract's shape.

Only the subset of jextract that the CUDA driver, HIP runtime and NCCL headers need is
implemented; anything outside it (bitfield accessors, function pointers, variadic functions,
globals, anonymous struct/union members) is reported as an error instead of being skipped silently.
See bindings/GENERATED.md for the differences to stock jextract.

Usage:
  gin4j_jextract.py --output SRC_ROOT @lib.args          generate (deletes the package folder first)
  gin4j_jextract.py --list-enum ENUM_TYPEDEF @lib.args   print --include-constant lines for an enum
  gin4j_jextract.py --summary @lib.args                  print counts and header files with sha256
"""

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import sys

import clang.cindex as ci

# -l name -> the hand-written dev.gin4j.bindings.NativeLibrary instance that loads it.
LIBRARIES = {"cuda": "CUDA", "amdhip64": "HIP", "nccl": "NCCL", "nvrtc": "NVRTC"}

JAVA_KEYWORDS = set("""abstract assert boolean break byte case catch char class const continue
default do double else enum extends final finally float for goto if implements import instanceof
int interface long native new package private protected public return short static strictfp super
switch synchronized this throw throws transient try void volatile while true false null var yield
record sealed permits""".split())

MACRO_PREFIX = "gin4j_macro_value_"
MACRO_FILE = "gin4j_generator_main.c"


class GenError(Exception):
    pass


# ---------------------------------------------------------------- argfile

def read_argfile(path):
    """jextract/javac @argfile syntax: whitespace separated, quotes allowed, '#' starts a comment."""
    tokens = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            tokens.extend(shlex.split(stripped, comments=True))
    return tokens


def expand_vars(text):
    def repl(m):
        name = m.group(1)
        if name not in os.environ or not os.environ[name]:
            raise GenError(f"argfile uses ${{{name}}} but the environment variable {name} is not set")
        return os.environ[name]
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", repl, text)


class Options:
    def __init__(self, tokens):
        self.headers = []          # as written in the argfile (placeholders kept)
        self.clang_args = []       # -I/-D, expanded
        self.package = None
        self.header_class = None
        self.libraries = []
        self.include = {"function": [], "struct": [], "union": [], "typedef": [], "constant": []}
        it = iter(tokens)
        for tok in it:
            def value():
                try:
                    return next(it)
                except StopIteration:
                    raise GenError(f"option {tok} needs a value")
            if tok in ("-t", "--target-package"):
                self.package = value()
            elif tok == "--header-class-name":
                self.header_class = value()
            elif tok in ("-l", "--library"):
                self.libraries.append(value())
            elif tok in ("-I", "-D"):
                v = value()
                self.clang_args.append(tok + expand_vars(v))
            elif tok.startswith("-I") or tok.startswith("-D"):
                self.clang_args.append(tok[:2] + expand_vars(tok[2:]))
            elif tok.startswith("--include-"):
                kind = tok[len("--include-"):]
                if kind not in self.include:
                    raise GenError(f"{tok} is not supported by this generator")
                self.include[kind].append(value())
            elif tok.startswith("-"):
                raise GenError(f"unsupported option {tok}")
            else:
                self.headers.append(tok)
        if not self.headers:
            raise GenError("no header file given")
        if not self.package or not self.header_class:
            raise GenError("--target-package and --header-class-name are required")
        # No -l: layouts and constants only (our kernels' ABI headers); functions need a library.
        if len(self.libraries) > 1 or (self.libraries and self.libraries[0] not in LIBRARIES):
            raise GenError(f"at most one -l out of {sorted(LIBRARIES)} is expected, got {self.libraries}")
        if not self.libraries and self.include["function"]:
            raise GenError("--include-function needs a library (-l)")
        for kind, names in self.include.items():
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise GenError(f"--include-{kind} repeated for {dups}")
        self.native_library = LIBRARIES[self.libraries[0]] if self.libraries else None


# ---------------------------------------------------------------- libclang

def load_clang():
    if not ci.Config.loaded:
        for candidate in ("/usr/lib/x86_64-linux-gnu/libclang-19.so.19", "/usr/lib/llvm-19/lib/libclang.so"):
            if os.path.exists(candidate):
                ci.Config.set_library_file(candidate)
                break
    lib = ci.conf.lib
    lib.clang_Cursor_Evaluate.argtypes = [ci.Cursor]
    lib.clang_Cursor_Evaluate.restype = ctypes.c_void_p
    lib.clang_EvalResult_getKind.argtypes = [ctypes.c_void_p]
    lib.clang_EvalResult_getKind.restype = ctypes.c_int
    lib.clang_EvalResult_isUnsignedInt.argtypes = [ctypes.c_void_p]
    lib.clang_EvalResult_isUnsignedInt.restype = ctypes.c_uint
    lib.clang_EvalResult_getAsUnsigned.argtypes = [ctypes.c_void_p]
    lib.clang_EvalResult_getAsUnsigned.restype = ctypes.c_ulonglong
    lib.clang_EvalResult_getAsLongLong.argtypes = [ctypes.c_void_p]
    lib.clang_EvalResult_getAsLongLong.restype = ctypes.c_longlong
    lib.clang_EvalResult_getAsDouble.argtypes = [ctypes.c_void_p]
    lib.clang_EvalResult_getAsDouble.restype = ctypes.c_double
    lib.clang_EvalResult_dispose.argtypes = [ctypes.c_void_p]
    lib.clang_EvalResult_dispose.restype = None
    return lib


def evaluate_integer(lib, cursor):
    res = lib.clang_Cursor_Evaluate(cursor)
    if not res:
        return None
    try:
        kind = lib.clang_EvalResult_getKind(res)
        if kind == 1:  # CXEval_Int
            if lib.clang_EvalResult_isUnsignedInt(res):
                return lib.clang_EvalResult_getAsUnsigned(res)
            return lib.clang_EvalResult_getAsLongLong(res)
        if kind == 2:  # CXEval_Float
            return lib.clang_EvalResult_getAsDouble(res)
        return None
    finally:
        lib.clang_EvalResult_dispose(res)


def parse(opts):
    lib = load_clang()
    headers = [expand_vars(h) for h in opts.headers]
    for h in headers:
        if not os.path.isfile(h):
            raise GenError(f"header {h} not found (run bindings/fetch-headers and set GIN4J_HEADERS)")
    main = "".join(f'#include "{h}"\n' for h in headers)
    # jextract evaluates macros the same way: a variable initialised with the macro.
    for name in opts.include["constant"]:
        main += (f"#ifdef {name}\n__auto_type {MACRO_PREFIX}{name} = ({name});\n"
                 f"const long long {MACRO_PREFIX}addr_{name} = (long long)({name});\n#endif\n")
    args = ["-x", "c", "-std=gnu11"] + opts.clang_args
    index = ci.Index.create()
    tu = index.parse(MACRO_FILE, args=args, unsaved_files=[(MACRO_FILE, main)],
                     options=ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD
                     | ci.TranslationUnit.PARSE_SKIP_FUNCTION_BODIES)
    errors = []
    for d in tu.diagnostics:
        if d.severity < ci.Diagnostic.Error:
            continue
        loc = d.location
        if loc.file is not None and loc.file.name == MACRO_FILE:
            continue  # address casts of non-pointer macros; the value var is what counts
        errors.append(str(d))
    if errors:
        raise GenError("clang errors while parsing:\n  " + "\n  ".join(errors[:20]))
    return tu, lib, headers


# ---------------------------------------------------------------- model

class Model:
    def __init__(self, opts, tu, lib):
        self.opts = opts
        self.lib = lib
        self.items = []            # (kind, name, data) in source order
        self.functions = {}
        self.records = {}          # struct tag -> definition cursor
        self.typedefs = {}         # typedef name -> cursor
        self.enum_constants = {}   # name -> (cursor, enum cursor)
        self.macros = {}           # name -> definition cursor
        self.macro_vars = {}       # name -> var cursor
        self.macro_addr_vars = {}
        self.order = {}
        self._collect(tu)

    def _note(self, key):
        if key not in self.order:
            self.order[key] = len(self.order)

    def _collect(self, tu):
        for c in tu.cursor.get_children():
            k = c.kind
            if k == ci.CursorKind.FUNCTION_DECL:
                if c.spelling not in self.functions:
                    self.functions[c.spelling] = c
                    self._note(("function", c.spelling))
            elif k == ci.CursorKind.STRUCT_DECL or k == ci.CursorKind.UNION_DECL:
                if c.is_definition() and c.spelling and not is_unnamed(c):
                    self.records.setdefault(c.spelling, c)
                    self._note(("struct", c.spelling))
            elif k == ci.CursorKind.TYPEDEF_DECL:
                if c.spelling not in self.typedefs:
                    self.typedefs[c.spelling] = c
                    self._note(("typedef", c.spelling))
                for child in c.get_children():
                    if child.kind == ci.CursorKind.ENUM_DECL:
                        self._enum(child)
            elif k == ci.CursorKind.ENUM_DECL:
                self._enum(c)
            elif k == ci.CursorKind.MACRO_DEFINITION:
                if c.location.file is not None and c.location.file.name != MACRO_FILE:
                    self.macros[c.spelling] = c
                    self._note(("constant", c.spelling))
            elif k == ci.CursorKind.VAR_DECL and c.spelling.startswith(MACRO_PREFIX):
                rest = c.spelling[len(MACRO_PREFIX):]
                if rest.startswith("addr_"):
                    self.macro_addr_vars[rest[len("addr_"):]] = c
                else:
                    self.macro_vars[rest] = c

    def _enum(self, enum_cursor):
        for e in enum_cursor.get_children():
            if e.kind == ci.CursorKind.ENUM_CONSTANT_DECL and e.spelling not in self.enum_constants:
                self.enum_constants[e.spelling] = (e, enum_cursor)
                self._note(("constant", e.spelling))


# ---------------------------------------------------------------- types

PRIMS = {
    ci.TypeKind.BOOL: ("C_BOOL", "boolean", "OfBoolean"),
    ci.TypeKind.CHAR_S: ("C_CHAR", "byte", "OfByte"),
    ci.TypeKind.CHAR_U: ("C_CHAR", "byte", "OfByte"),
    ci.TypeKind.SCHAR: ("C_CHAR", "byte", "OfByte"),
    ci.TypeKind.UCHAR: ("C_CHAR", "byte", "OfByte"),
    ci.TypeKind.SHORT: ("C_SHORT", "short", "OfShort"),
    ci.TypeKind.USHORT: ("C_SHORT", "short", "OfShort"),
    ci.TypeKind.INT: ("C_INT", "int", "OfInt"),
    ci.TypeKind.UINT: ("C_INT", "int", "OfInt"),
    ci.TypeKind.LONG: ("C_LONG", "long", "OfLong"),
    ci.TypeKind.ULONG: ("C_LONG", "long", "OfLong"),
    ci.TypeKind.LONGLONG: ("C_LONG_LONG", "long", "OfLong"),
    ci.TypeKind.ULONGLONG: ("C_LONG_LONG", "long", "OfLong"),
    ci.TypeKind.FLOAT: ("C_FLOAT", "float", "OfFloat"),
    ci.TypeKind.DOUBLE: ("C_DOUBLE", "double", "OfDouble"),
}


def canonical(t):
    return t.get_canonical()


def is_unnamed(decl):
    """clang >= 16 spells 'typedef struct { ... } T' as struct T: look at the tokens instead."""
    if decl.is_anonymous():
        return True
    toks = [t.spelling for t in decl.get_tokens()][:3]
    return len(toks) >= 2 and toks[0] in ("struct", "union", "enum") and toks[1] == "{"


def enum_int_type(enum_cursor):
    return enum_cursor.enum_type.get_canonical()


class TypeInfo:
    """How a C type appears in Java: layout expression, carrier type and layout class."""
    def __init__(self, kind, layout, carrier, layout_class, record=None, dims=None, elem=None):
        self.kind = kind                # prim | pointer | record | array
        self.layout = layout
        self.carrier = carrier
        self.layout_class = layout_class
        self.record = record            # Java class name of the record
        self.dims = dims
        self.elem = elem


class Generator:
    def __init__(self, opts, model):
        self.opts = opts
        self.m = model
        self.h = opts.header_class
        self.struct_classes = {}        # java class -> ("record", cursor) | ("alias", parent java class, typedef cursor)
        self.record_class_of = {}       # canonical record declaration hash -> java class name
        self.resolve()

    # ---- filters

    def resolve(self):
        inc = self.opts.include
        missing = []
        for kind, want in (("struct", ci.CursorKind.STRUCT_DECL), ("union", ci.CursorKind.UNION_DECL)):
            for name in inc[kind]:
                c = self.m.records.get(name)
                if c is None:
                    missing.append(f"--include-{kind} {name}")
                    continue
                if c.kind != want:
                    other = "union" if kind == "struct" else "struct"
                    raise GenError(f"{name} is a {other}: include it with --include-{other}")
                self.struct_classes[name] = ("record", c)
                self.record_class_of[c.hash] = name
        self.typedef_layouts = []
        for name in inc["typedef"]:
            c = self.m.typedefs.get(name)
            if c is None:
                missing.append(f"--include-typedef {name}")
                continue
            under = c.underlying_typedef_type
            canon = canonical(under)
            if canon.kind == ci.TypeKind.RECORD:
                decl = canon.get_declaration()
                if not decl.is_definition() and decl.get_definition() is None:
                    raise GenError(f"typedef {name} names an incomplete struct: leave it out, pointers to it are C_POINTER")
                if is_unnamed(decl.get_definition() or decl):
                    self.struct_classes[name] = ("record", decl.get_definition() or decl)
                    self.record_class_of[(decl.get_definition() or decl).hash] = name
                else:
                    # typedef of a named struct, or of another typedef: jextract makes it a subclass
                    parent = self._typedef_parent(under)
                    self.struct_classes[name] = ("alias", parent, c)
            else:
                self.typedef_layouts.append(name)
        for kind in ("function", "constant"):
            table = self.m.functions if kind == "function" else None
            for name in inc[kind]:
                if kind == "function" and name not in self.m.functions:
                    missing.append(f"--include-function {name}")
                if kind == "constant" and name not in self.m.enum_constants and name not in self.m.macros:
                    missing.append(f"--include-constant {name}")
        if missing:
            raise GenError("not declared by the header(s):\n  " + "\n  ".join(missing))
        for name, entry in self.struct_classes.items():
            if entry[0] == "alias" and entry[1] not in self.struct_classes:
                raise GenError(f"typedef {name} depends on {entry[1]}, which is not included")

    def _typedef_parent(self, under):
        # 'typedef CUipcMemHandle_v1 CUipcMemHandle' -> CUipcMemHandle_v1; 'typedef struct X Y' -> X
        t = under
        if t.kind == ci.TypeKind.ELABORATED:
            named = t.get_named_type()
            if named.kind == ci.TypeKind.TYPEDEF:
                return named.get_declaration().spelling
            return canonical(t).get_declaration().spelling
        if t.kind == ci.TypeKind.TYPEDEF:
            return t.get_declaration().spelling
        return canonical(t).get_declaration().spelling

    def record_class(self, canon_type, context):
        decl = canon_type.get_declaration()
        d = decl.get_definition() or decl
        cls = self.record_class_of.get(d.hash)
        if cls is None:
            raise GenError(f"{context} uses struct {canon_type.spelling} by value, but it is not included")
        return cls

    def type_info(self, t, context):
        c = canonical(t)
        if c.kind in PRIMS:
            lay, carrier, lc = PRIMS[c.kind]
            return TypeInfo("prim", f"{self.h}.{lay}", carrier, lc)
        if c.kind == ci.TypeKind.ENUM:
            return self.type_info(enum_int_type(c.get_declaration()), context)
        if c.kind in (ci.TypeKind.POINTER, ci.TypeKind.BLOCKPOINTER):
            return TypeInfo("pointer", f"{self.h}.C_POINTER", "MemorySegment", "AddressLayout")
        if c.kind == ci.TypeKind.RECORD:
            cls = self.record_class(c, context)
            return TypeInfo("record", f"{cls}.layout()", "MemorySegment", "GroupLayout", record=cls)
        if c.kind == ci.TypeKind.CONSTANTARRAY:
            dims = []
            e = c
            while e.kind == ci.TypeKind.CONSTANTARRAY:
                dims.append(e.element_count)
                e = canonical(e.element_type)
            elem = self.type_info(e, context)
            lay = elem.layout
            for n in reversed(dims):
                lay = f"MemoryLayout.sequenceLayout({n}, {lay})"
            return TypeInfo("array", lay, "MemorySegment", "SequenceLayout", dims=dims, elem=elem)
        raise GenError(f"{context}: type {t.spelling} ({c.kind}) is not supported by this generator")

    # ---- output helpers

    def file_header(self):
        hdrs = ", ".join(self.opts.headers)
        lib_import = "import dev.gin4j.bindings.NativeLibrary;\n\n" if self.opts.native_library else ""
        return (f"// Generated by gin4j bindings/generate (jextract-compatible generator on libclang) from {hdrs}.\n"
                f"// Do not edit: change bindings/{self.argfile_name} and regenerate.\n\n"
                f"package {self.opts.package};\n\n"
                "import java.lang.invoke.*;\n"
                "import java.lang.foreign.*;\n"
                "import java.util.*;\n"
                "import java.util.function.*;\n"
                "import java.util.stream.*;\n\n"
                f"{lib_import}"
                "import static java.lang.foreign.ValueLayout.*;\n"
                "import static java.lang.foreign.MemoryLayout.PathElement.*;\n\n")

    @staticmethod
    def snippet(lines, indent="    "):
        out = [f"{indent}/**", f"{indent} * {{@snippet lang=c :"]
        for l in lines:
            out.append(f"{indent} * {l}".rstrip())
        out.append(f"{indent} * }}")
        out.append(f"{indent} */")
        return "\n".join(out) + "\n"

    @staticmethod
    def doc(text, indent="    "):
        return f"{indent}/**\n{indent} * {text}\n{indent} */\n"

    @staticmethod
    def java_name(name):
        return name + "_" if name in JAVA_KEYWORDS else name

    # ---- header class

    def function_signature(self, c):
        params = []
        for i, a in enumerate(c.get_arguments()):
            params.append(f"{a.type.spelling} {a.spelling}".strip() if a.spelling else a.type.spelling)
        return f"{c.result_type.spelling} {c.spelling}({', '.join(params)})"

    def emit_function(self, name):
        c = self.m.functions[name]
        if c.type.kind == ci.TypeKind.FUNCTIONPROTO and c.type.is_function_variadic():
            raise GenError(f"{name} is variadic: not supported by this generator")
        h = self.h
        ret = c.result_type
        ret_void = canonical(ret).kind == ci.TypeKind.VOID
        ret_info = None if ret_void else self.type_info(ret, f"return type of {name}")
        args = list(c.get_arguments())
        arg_infos = [self.type_info(a.type, f"parameter {i} of {name}") for i, a in enumerate(args)]
        names = []
        for i, a in enumerate(args):
            n = self.java_name(a.spelling) if a.spelling else f"x{i}"
            if n in names:
                n = f"x{i}"
            names.append(n)
        sig = self.function_signature(c)
        desc_items = [info.layout for info in arg_infos]
        if ret_void:
            desc = "FunctionDescriptor.ofVoid(" + ("\n            " + ",\n            ".join(desc_items) + "\n        " if desc_items else "") + ")"
        else:
            desc = "FunctionDescriptor.of(\n            " + ",\n            ".join([ret_info.layout] + desc_items) + "\n        )"
        s = []
        s.append(f"    private static class {name} {{\n")
        s.append(f"        public static final FunctionDescriptor DESC = {desc};\n\n")
        s.append(f"        public static final MemorySegment ADDR = {h}.findOrNull(\"{name}\");\n\n")
        s.append(f"        public static final MethodHandle HANDLE = ADDR == null ? null : Linker.nativeLinker().downcallHandle(ADDR, DESC);\n")
        s.append("    }\n\n")
        s.append("    /**\n     * Function descriptor for:\n     * {@snippet lang=c :\n")
        s.append(f"     * {sig}\n     * }}\n     */\n")
        s.append(f"    public static FunctionDescriptor {name}$descriptor() {{\n        return {name}.DESC;\n    }}\n\n")
        s.append("    /**\n     * Downcall method handle for:\n     * {@snippet lang=c :\n")
        s.append(f"     * {sig}\n     * }}\n     * @throws UnsatisfiedLinkError if the library or the symbol is missing\n     */\n")
        s.append(f"    public static MethodHandle {name}$handle() {{\n        return requireHandle({name}.HANDLE, \"{name}\");\n    }}\n\n")
        s.append("    /**\n     * Address for:\n     * {@snippet lang=c :\n")
        s.append(f"     * {sig}\n     * }}\n     * @throws UnsatisfiedLinkError if the library or the symbol is missing\n     */\n")
        s.append(f"    public static MemorySegment {name}$address() {{\n        return requireAddress({name}.ADDR, \"{name}\");\n    }}\n\n")
        params = [f"{i.carrier} {n}" for i, n in zip(arg_infos, names)]
        call_args = list(names)
        if ret_info is not None and ret_info.kind == "record":
            params.insert(0, "SegmentAllocator allocator")
            call_args.insert(0, "allocator")
        ret_java = "void" if ret_void else ret_info.carrier
        s.append(self.snippet([sig]))
        s.append(f"    public static {ret_java} {name}({', '.join(params)}) {{\n")
        s.append(f"        var mh$ = requireHandle({name}.HANDLE, \"{name}\");\n")
        s.append("        try {\n")
        s.append("            if (TRACE_DOWNCALLS) {\n")
        s.append(f"                traceDowncall(\"{name}\"{''.join(', ' + a for a in call_args)});\n")
        s.append("            }\n")
        invoke = f"mh$.invokeExact({', '.join(call_args)})"
        if ret_void:
            s.append(f"            {invoke};\n")
        else:
            s.append(f"            return ({ret_java}){invoke};\n")
        s.append("        } catch (Error | RuntimeException ex) {\n")
        s.append("            throw ex;\n")
        s.append("        } catch (Throwable ex$) {\n")
        s.append("            throw new AssertionError(\"should not reach here\", ex$);\n")
        s.append("        }\n")
        s.append("    }\n\n")
        return "".join(s)

    def constant_value(self, name):
        """(java type, java initializer, c text) of an enum constant or macro."""
        if name in self.m.enum_constants:
            e, enum = self.m.enum_constants[name]
            info = self.type_info(enum_int_type(enum), f"enum constant {name}")
            v = e.enum_value
            enum_name = "<anonymous>" if is_unnamed(enum) else enum.spelling
            return info.carrier, f"({info.carrier}){v}L", f"enum {enum_name}.{name} = {v}"
        var = self.m.macro_vars.get(name)
        if var is None:
            raise GenError(f"macro {name} could not be evaluated")
        t = canonical(var.type)
        text = " ".join(tok.spelling for tok in list(self.m.macros[name].get_tokens())[1:])
        ctext = f"#define {name} {text}"
        if t.kind in (ci.TypeKind.POINTER,):
            addr = self.m.macro_addr_vars.get(name)
            v = None if addr is None else evaluate_integer(self.m.lib, addr)
            if v is None:
                raise GenError(f"macro {name}: pointer value could not be evaluated (string macros are not supported)")
            return "MemorySegment", f"MemorySegment.ofAddress({v}L)", ctext
        v = evaluate_integer(self.m.lib, var)
        if v is None:
            raise GenError(f"macro {name} is not an integer or floating constant")
        if t.kind in PRIMS:
            _, carrier, _ = PRIMS[t.kind]
            if carrier in ("float", "double"):
                return carrier, f"{repr(float(v))}{'f' if carrier == 'float' else 'd'}", ctext
            if carrier == "boolean":
                return "boolean", "true" if v else "false", ctext
            return carrier, f"({carrier}){int(v)}L", ctext
        raise GenError(f"macro {name} has unsupported type {t.spelling}")

    def emit_constant(self, name):
        jtype, init, ctext = self.constant_value(name)
        s = f"    private static final {jtype} {name} = {init};\n"
        s += self.snippet([ctext])
        s += f"    public static {jtype} {name}() {{\n        return {name};\n    }}\n\n"
        return s

    def emit_typedef_layout(self, name):
        c = self.m.typedefs[name]
        info = self.type_info(c.underlying_typedef_type, f"typedef {name}")
        if info.kind == "array":
            raise GenError(f"typedef {name} of an array is not supported")
        lc = info.layout_class if info.layout_class == "AddressLayout" else "ValueLayout." + info.layout_class
        s = self.snippet([f"typedef {c.underlying_typedef_type.spelling} {name}"])
        s += f"    public static final {lc} {name} = {info.layout};\n\n"
        return s

    def header_class(self):
        h = self.h
        lib = self.opts.native_library
        s = [self.file_header()]
        loaded = ", loaded through {@link NativeLibrary#" + lib + "}" if lib else " (layouts and constants, no library)"
        s.append("/**\n * Bindings to {@code " + ", ".join(os.path.basename(x) for x in self.opts.headers) +
                 "}" + loaded + ".\n */\n")
        s.append(f"public class {h} {{\n\n")
        s.append(f"    {h}() {{\n        // Should not be called directly\n    }}\n\n")
        if lib:  # the downcall helpers; an ABI header (no -l) has layouts and constants only
            s.append("    static final boolean TRACE_DOWNCALLS = Boolean.getBoolean(\"jextract.trace.downcalls\");\n\n")
            s.append("    static void traceDowncall(String name, Object... args) {\n"
                     "        String traceArgs = Arrays.stream(args)\n"
                     "                .map(Object::toString)\n"
                     "                .collect(Collectors.joining(\", \"));\n"
                     "        System.out.printf(\"%s(%s)\\n\", name, traceArgs);\n"
                     "    }\n\n")
            s.append("    // gin4j: the library is found by NativeLibrary (environment variable, then sonames),\n"
                     "    // lazily, so loading this class never fails; a missing symbol fails on first use.\n")
            s.append(f"    static final NativeLibrary LIBRARY = NativeLibrary.{lib};\n\n")
            s.append("    static MemorySegment findOrNull(String symbol) {\n"
                     "        return LIBRARY.find(symbol).orElse(null);\n"
                     "    }\n\n")
            s.append("    static MethodHandle requireHandle(MethodHandle handle, String symbol) {\n"
                     "        if (handle == null) {\n"
                     "            throw LIBRARY.missing(symbol);\n"
                     "        }\n"
                     "        return handle;\n"
                     "    }\n\n")
            s.append("    static MemorySegment requireAddress(MemorySegment address, String symbol) {\n"
                     "        if (address == null) {\n"
                     "            throw LIBRARY.missing(symbol);\n"
                     "        }\n"
                     "        return address;\n"
                     "    }\n\n")
        s.append("    public static final ValueLayout.OfBoolean C_BOOL = ValueLayout.JAVA_BOOLEAN;\n"
                 "    public static final ValueLayout.OfByte C_CHAR = ValueLayout.JAVA_BYTE;\n"
                 "    public static final ValueLayout.OfShort C_SHORT = ValueLayout.JAVA_SHORT;\n"
                 "    public static final ValueLayout.OfInt C_INT = ValueLayout.JAVA_INT;\n"
                 "    public static final ValueLayout.OfLong C_LONG_LONG = ValueLayout.JAVA_LONG;\n"
                 "    public static final ValueLayout.OfFloat C_FLOAT = ValueLayout.JAVA_FLOAT;\n"
                 "    public static final ValueLayout.OfDouble C_DOUBLE = ValueLayout.JAVA_DOUBLE;\n"
                 "    public static final AddressLayout C_POINTER = ValueLayout.ADDRESS\n"
                 "            .withTargetLayout(MemoryLayout.sequenceLayout(java.lang.Long.MAX_VALUE, JAVA_BYTE));\n"
                 "    // LP64 (Linux x86-64 and aarch64): C long is 64 bits\n"
                 "    public static final ValueLayout.OfLong C_LONG = ValueLayout.JAVA_LONG;\n\n")
        inc = self.opts.include
        wanted = set()
        for n in inc["function"]:
            wanted.add(("function", n))
        for n in inc["constant"]:
            wanted.add(("constant", n))
        for n in self.typedef_layouts:
            wanted.add(("typedef", n))
        for key in sorted(wanted, key=lambda k: (self.m.order.get(k, 1 << 30), k)):
            kind, name = key
            if kind == "function":
                s.append(self.emit_function(name))
            elif kind == "constant":
                s.append(self.emit_constant(name))
            else:
                s.append(self.emit_typedef_layout(name))
        text = "".join(s).rstrip("\n") + "\n}\n"
        return text

    # ---- struct classes

    def field_decl_text(self, f):
        t = f.type
        dims = ""
        while canonical(t).kind == ci.TypeKind.CONSTANTARRAY and t.kind in (ci.TypeKind.CONSTANTARRAY,):
            dims += f"[{t.element_count}]"
            t = t.element_type
        sp = t.spelling
        if sp.endswith("*"):
            return f"{sp}{f.spelling}{dims}"
        return f"{sp} {f.spelling}{dims}"

    def struct_class(self, cls, cursor):
        return self.file_header() + self.record_class_text(cls, cls, cursor, nested=False)

    def record_class_text(self, cls, path, cursor, nested):
        """One struct or union as a Java class (path: its name as other classes spell it). A member
        of an unnamed struct/union type becomes a nested class named after the member, as jextract
        names it; anonymous members (no name) are not supported."""
        is_union = cursor.kind == ci.CursorKind.UNION_DECL
        what = "union" if is_union else "struct"
        ctype = cursor.type
        size = ctype.get_size()
        fields = [f for f in cursor.get_children() if f.kind == ci.CursorKind.FIELD_DECL]
        # An unnamed struct/union inside is either the type of a named member (struct { .. } dim;),
        # which becomes a nested class, or an anonymous member (C11), which is not supported.
        field_types = {(canonical(f.type).get_declaration().get_definition() or canonical(f.type).get_declaration()).hash
                       for f in fields if canonical(f.type).kind == ci.TypeKind.RECORD}
        for f in cursor.get_children():
            if f.kind in (ci.CursorKind.STRUCT_DECL, ci.CursorKind.UNION_DECL) and f.is_anonymous() \
                    and (f.get_definition() or f).hash not in field_types:
                raise GenError(f"{what} {path}: anonymous nested struct/union members are not supported")
        nested_classes = []
        for f in fields:
            ft = canonical(f.type)
            if ft.kind == ci.TypeKind.RECORD:
                d = ft.get_declaration()
                d = d.get_definition() or d
                if is_unnamed(d) and d.hash not in self.record_class_of:
                    self.record_class_of[d.hash] = f"{path}.{f.spelling}"
                    nested_classes.append(self.record_class_text(f.spelling, f"{path}.{f.spelling}", d, nested=True))
        members = []      # layout lines
        accessors = []
        pos = 0
        widest = 0
        c_lines = []
        tag = "" if is_unnamed(cursor) else cursor.spelling
        header_line = f"{what} {tag} {{" if tag else f"{what} {{"
        c_lines.append(header_line)
        i = 0
        while i < len(fields):
            f = fields[i]
            c_lines.append("    " + (f"{self.field_decl_text(f)} : {f.get_bitfield_width()};" if f.is_bitfield() else f"{self.field_decl_text(f)};"))
            off_bits = f.get_field_offsetof()
            if f.is_bitfield():
                if is_union:
                    raise GenError(f"union {path}: bitfield members are not supported")
                # jextract does not generate accessors for bitfields: their storage becomes padding
                j = i
                while j + 1 < len(fields) and fields[j + 1].is_bitfield():
                    j += 1
                    c_lines.append(f"    {self.field_decl_text(fields[j])} : {fields[j].get_bitfield_width()};")
                start = off_bits // 8
                if start > pos:
                    members.append(f"MemoryLayout.paddingLayout({start - pos})")
                    pos = start
                end_bits = fields[j].get_field_offsetof() + fields[j].get_bitfield_width()
                if j + 1 < len(fields):
                    end = fields[j + 1].get_field_offsetof() // 8
                else:
                    end = size
                end = max(end, (end_bits + 7) // 8)
                members.append(f"MemoryLayout.paddingLayout({end - pos})")
                pos = end
                i = j + 1
                continue
            if off_bits % 8:
                raise GenError(f"{what} {path}: field {f.spelling} is not byte aligned")
            off = off_bits // 8
            if is_union:
                if off != 0:
                    raise GenError(f"union {path}: member {f.spelling} is not at offset 0")
            elif off > pos:
                members.append(f"MemoryLayout.paddingLayout({off - pos})")
                pos = off
            elif off < pos:
                raise GenError(f"struct {path}: overlapping field {f.spelling}")
            info = self.type_info(f.type, f"field {path}.{f.spelling}")
            fname = f.spelling
            jname = self.java_name(fname)
            members.append(f"{info.layout}.withName(\"{fname}\")")
            if is_union:
                widest = max(widest, f.type.get_size())
            else:
                pos = off + f.type.get_size()
            accessors.append(self.field_accessors(cls, f, jname, fname, info, off))
            i += 1
        if is_union:
            if size > widest:
                members.append(f"MemoryLayout.paddingLayout({size})")
        elif size > pos:
            members.append(f"MemoryLayout.paddingLayout({size - pos})")
        c_lines.append("}")
        s = []
        s.append(self.snippet(c_lines, indent="").replace("\n * ", "\n * ", 1))
        s.append(f"public {'static ' if nested else ''}class {cls} {{\n\n")
        s.append(f"    {cls}() {{\n        // Should not be called directly\n    }}\n\n")
        lname = tag if tag else cls
        kind_layout = "unionLayout" if is_union else "structLayout"
        s.append(f"    private static final GroupLayout $LAYOUT = MemoryLayout.{kind_layout}(\n        "
                 + ",\n        ".join(members) + f"\n    ).withName(\"{lname}\");\n\n")
        s.append(self.doc(f"The layout of this {what}"))
        s.append("    public static final GroupLayout layout() {\n        return $LAYOUT;\n    }\n\n")
        for n in nested_classes:
            s.append("".join(("    " + l) if l.strip() else l for l in n.splitlines(True)) + "\n")
        s.extend(accessors)
        s.append(self.struct_tail(what))
        text = "".join(s).rstrip("\n") + "\n}\n"
        return text

    def field_accessors(self, cls, f, jname, fname, info, off):
        decl = self.field_decl_text(f)
        snip = lambda what: f"    /**\n     * {what} for field:\n     * {{@snippet lang=c :\n     * {decl}\n     * }}\n     */\n"
        lc = info.layout_class
        s = [f"    private static final {lc} {jname}$LAYOUT = ({lc})$LAYOUT.select(groupElement(\"{fname}\"));\n\n"]
        s.append(snip("Layout"))
        s.append(f"    public static final {lc} {jname}$layout() {{\n        return {jname}$LAYOUT;\n    }}\n\n")
        s.append(f"    private static final long {jname}$OFFSET = {off};\n\n")
        s.append(snip("Offset"))
        s.append(f"    public static final long {jname}$offset() {{\n        return {jname}$OFFSET;\n    }}\n\n")
        if info.kind in ("prim", "pointer"):
            s.append(snip("Getter"))
            s.append(f"    public static {info.carrier} {jname}(MemorySegment struct) {{\n"
                     f"        return struct.get({jname}$LAYOUT, {jname}$OFFSET);\n    }}\n\n")
            s.append(snip("Setter"))
            s.append(f"    public static void {jname}(MemorySegment struct, {info.carrier} fieldValue) {{\n"
                     f"        struct.set({jname}$LAYOUT, {jname}$OFFSET, fieldValue);\n    }}\n\n")
        else:
            s.append(snip("Getter"))
            s.append(f"    public static MemorySegment {jname}(MemorySegment struct) {{\n"
                     f"        return struct.asSlice({jname}$OFFSET, {jname}$LAYOUT.byteSize());\n    }}\n\n")
            s.append(snip("Setter"))
            s.append(f"    public static void {jname}(MemorySegment struct, MemorySegment fieldValue) {{\n"
                     f"        MemorySegment.copy(fieldValue, 0L, struct, {jname}$OFFSET, {jname}$LAYOUT.byteSize());\n    }}\n\n")
        if info.kind == "array":
            dims = info.dims
            s.append(f"    private static long[] {jname}$DIMS = {{ {', '.join(str(d) for d in dims)} }};\n\n")
            s.append(snip("Dimensions for array"))
            s.append(f"    public static long[] {jname}$dimensions() {{\n        return {jname}$DIMS;\n    }}\n")
            idx_params = ", ".join(f"long index{k}" for k in range(len(dims)))
            idx_args = ", ".join(f"index{k}" for k in range(len(dims)))
            seq = ", ".join("sequenceElement()" for _ in dims)
            elem = info.elem
            if elem.kind in ("prim", "pointer"):
                s.append(f"    private static final VarHandle {jname}$ELEM_HANDLE = $LAYOUT.varHandle(groupElement(\"{fname}\"), {seq});\n\n")
                s.append(snip("Indexed getter"))
                s.append(f"    public static {elem.carrier} {jname}(MemorySegment struct, {idx_params}) {{\n"
                         f"        return ({elem.carrier}){jname}$ELEM_HANDLE.get(struct, 0L, {idx_args});\n    }}\n\n")
                s.append(snip("Indexed setter"))
                s.append(f"    public static void {jname}(MemorySegment struct, {idx_params}, {elem.carrier} fieldValue) {{\n"
                         f"        {jname}$ELEM_HANDLE.set(struct, 0L, {idx_args}, fieldValue);\n    }}\n\n")
            else:
                s.append(f"    private static final MethodHandle {jname}$ELEM_HANDLE = $LAYOUT.sliceHandle(groupElement(\"{fname}\"), {seq});\n\n")
                s.append(snip("Indexed getter"))
                s.append(f"    public static MemorySegment {jname}(MemorySegment struct, {idx_params}) {{\n"
                         f"        try {{\n            return (MemorySegment){jname}$ELEM_HANDLE.invokeExact(struct, 0L, {idx_args});\n"
                         f"        }} catch (Throwable ex$) {{\n            throw new AssertionError(\"should not reach here\", ex$);\n        }}\n    }}\n\n")
                s.append(snip("Indexed setter"))
                s.append(f"    public static void {jname}(MemorySegment struct, {idx_params}, MemorySegment fieldValue) {{\n"
                         f"        MemorySegment.copy(fieldValue, 0L, {jname}(struct, {idx_args}), 0L, {elem.layout}.byteSize());\n    }}\n\n")
        return "".join(s)

    def struct_tail(self, what="struct"):
        return ("    /**\n     * Obtains a slice of {@code arrayParam} which selects the array element at {@code index}.\n"
                "     * The returned segment has address {@code arrayParam.address() + index * layout().byteSize()}\n     */\n"
                "    public static MemorySegment asSlice(MemorySegment array, long index) {\n"
                "        return array.asSlice(layout().byteSize() * index);\n    }\n\n"
                f"    /**\n     * The size (in bytes) of this {what}\n     */\n"
                "    public static long sizeof() { return layout().byteSize(); }\n\n"
                "    /**\n     * Allocate a segment of size {@code layout().byteSize()} using {@code allocator}\n     */\n"
                "    public static MemorySegment allocate(SegmentAllocator allocator) {\n"
                "        return allocator.allocate(layout());\n    }\n\n"
                "    /**\n     * Allocate an array of size {@code elementCount} using {@code allocator}.\n"
                "     * The returned segment has size {@code elementCount * layout().byteSize()}.\n     */\n"
                "    public static MemorySegment allocateArray(long elementCount, SegmentAllocator allocator) {\n"
                "        return allocator.allocate(MemoryLayout.sequenceLayout(elementCount, layout()));\n    }\n\n"
                "    /**\n     * Reinterprets {@code addr} using target {@code arena} and {@code cleanupAction} (if any).\n"
                "     * The returned segment has size {@code layout().byteSize()}\n     */\n"
                "    public static MemorySegment reinterpret(MemorySegment addr, Arena arena, Consumer<MemorySegment> cleanup) {\n"
                "        return reinterpret(addr, 1, arena, cleanup);\n    }\n\n"
                "    /**\n     * Reinterprets {@code addr} using target {@code arena} and {@code cleanupAction} (if any).\n"
                "     * The returned segment has size {@code elementCount * layout().byteSize()}\n     */\n"
                "    public static MemorySegment reinterpret(MemorySegment addr, long elementCount, Arena arena, Consumer<MemorySegment> cleanup) {\n"
                "        return addr.reinterpret(layout().byteSize() * elementCount, arena, cleanup);\n    }\n")

    def alias_class(self, cls, parent, typedef_cursor):
        s = [self.file_header()]
        s.append(self.snippet([f"typedef {typedef_cursor.underlying_typedef_type.spelling} {cls}"], indent=""))
        s.append(f"public class {cls} extends {parent} {{\n\n")
        s.append(f"    {cls}() {{\n        // Should not be called directly\n    }}\n}}\n")
        return "".join(s)

    def files(self):
        out = {f"{self.h}.java": self.header_class()}
        for cls in sorted(self.struct_classes):
            entry = self.struct_classes[cls]
            if entry[0] == "record":
                out[f"{cls}.java"] = self.struct_class(cls, entry[1])
            else:
                out[f"{cls}.java"] = self.alias_class(cls, entry[1], entry[2])
        return out


# ---------------------------------------------------------------- main

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def main(argv):
    output = None
    list_enum = None
    summary = False
    argfile = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--output":
            output = argv[i + 1]; i += 2; continue
        if a == "--list-enum":
            list_enum = argv[i + 1]; i += 2; continue
        if a == "--summary":
            summary = True; i += 1; continue
        if a.startswith("@"):
            argfile = a[1:]; i += 1; continue
        raise GenError(f"unknown argument {a}")
    if argfile is None:
        raise GenError("usage: gin4j_jextract.py (--output DIR | --list-enum NAME | --summary) @file.args")
    opts = Options(read_argfile(argfile))
    tu, lib, headers = parse(opts)
    model = Model(opts, tu, lib)
    if list_enum:
        td = model.typedefs.get(list_enum)
        decl = canonical(td.underlying_typedef_type).get_declaration() if td else None
        if decl is None or decl.kind != ci.CursorKind.ENUM_DECL:
            raise GenError(f"{list_enum} is not a typedef of an enum")
        for e in decl.get_children():
            if e.kind == ci.CursorKind.ENUM_CONSTANT_DECL:
                print(f"--include-constant {e.spelling}")
        return 0
    gen = Generator(opts, model)
    gen.argfile_name = os.path.basename(argfile)
    files = gen.files()
    if summary:
        included = set()
        for f in tu.get_includes():
            included.add(os.path.realpath(f.include.name))
        print(f"functions {len(opts.include['function'])}")
        print(f"structs {sum(1 for v in gen.struct_classes.values() if v[0] == 'record')}")
        print(f"struct typedefs {sum(1 for v in gen.struct_classes.values() if v[0] == 'alias')}")
        print(f"typedef layouts {len(gen.typedef_layouts)}")
        print(f"enum constants {sum(1 for n in opts.include['constant'] if n in model.enum_constants)}")
        print(f"macro constants {sum(1 for n in opts.include['constant'] if n not in model.enum_constants)}")
        roots = [a[2:] for a in opts.clang_args if a.startswith("-I")]
        files = {os.path.realpath(h) for h in headers}
        for inc in tu.get_includes():
            files.add(os.path.realpath(inc.include.name))
        for f in sorted(files):
            for r in roots + [os.path.dirname(os.path.realpath(h)) for h in headers]:
                r = os.path.realpath(r)
                if f.startswith(r + os.sep):
                    print(f"header {os.path.relpath(f, r)} {sha256(f)}")
                    break
        return 0
    if output is None:
        raise GenError("--output is required")
    pkg_dir = os.path.join(output, *opts.package.split("."))
    if os.path.isdir(pkg_dir):
        shutil.rmtree(pkg_dir)
    os.makedirs(pkg_dir)
    for name in sorted(files):
        with open(os.path.join(pkg_dir, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(files[name])
    print(f"{opts.package}: {len(files)} files, {len(opts.include['function'])} functions -> {pkg_dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except GenError as e:
        print(f"gin4j_jextract: error: {e}", file=sys.stderr)
        sys.exit(1)
