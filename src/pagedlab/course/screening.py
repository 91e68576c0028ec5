"""Screening a submitted region body before the grader runs it (chapters/98-assignments.md, What a body may use).

Builds on: course/regions.py (the regions).
Read with: chapters/98-assignments.md.

A body is code the grader is about to run in a process where the teacher's
reference is one `import` away (any Python finds an installed package through
sys.path, importlib.metadata or site-packages). An honest solution of a task
only uses what its file already has: the names bound in that file, a few safe
builtins, its own locals, attributes of the objects it is handed. So a body is
refused, before anything runs, when it

    imports anything                        import x / from x import y / __import__
    reaches for code or files               exec eval compile open getattr globals vars ...
    names a module of the interpreter       sys os builtins importlib inspect subprocess ...
    touches dunders or frames               x.__class__, f.__globals__, frame.f_back, __builtins__
                                            (a class's private self.__x is its own: Python renames it)
    goes below a module's public surface    torch._C, np.lib._x, torch.utils, torch.hub ...
    uses a name its file does not have      (a typo is refused too, with the name)
    defines a class, or global / nonlocal
    reaches outside its region              a line indented less than the region, or unbalanced code

`screen(body, indent, file_source, whole_functions)` returns the reasons (empty: accepted).
The grader then splices the body into the teacher's file; a refused task scores zero.
"""

from __future__ import annotations

import ast
import textwrap

# Builtins a body may call: data structures, arithmetic, iteration and the exceptions solutions raise.
SAFE_BUILTINS = frozenset(
    """abs all any bool bytes callable chr dict divmod enumerate filter float format frozenset hash int isinstance
    issubclass iter len list map max min next object ord pow print property range repr reversed round set slice
    sorted str sum super tuple type zip staticmethod classmethod NotImplemented Ellipsis None True False
    ArithmeticError AssertionError Exception IndexError KeyError LookupError NotImplementedError OverflowError
    RuntimeError StopIteration TypeError ValueError ZeroDivisionError""".split()
)

# Never a name, never an attribute: the ways from a body to other code, files, processes or the interpreter.
FORBIDDEN_NAMES = frozenset(
    """exec eval compile open __import__ getattr setattr delattr hasattr globals locals vars dir breakpoint input
    help exit quit memoryview sys os builtins importlib inspect subprocess pickle marshal ctypes gc types shutil
    pathlib Path io socket signal atexit site runpy threading multiprocessing codecs zipimport traceback pytest
    tests pagedlab linecache tokenize ast dis code codeop pkgutil sysconfig tempfile glob fnmatch weakref
    __builtins__ __loader__ __spec__ __file__ __name__ __dict__""".split()
)
FORBIDDEN_ATTRIBUTES = FORBIDDEN_NAMES | frozenset(
    """f_back f_builtins f_code f_globals f_locals f_lasti f_trace gi_frame gi_code cr_frame cr_code ag_frame ag_code
    tb_frame tb_next co_code co_consts func_globals func_code load_library load_inline loads hub jit package utils
    library cpp_extension compiler runtime backends tools testing distributed fx export save system popen spawnv
    execv import_module modules meta_path path_hooks read_text read_bytes write_text write_bytes ctypeslib
    f2py distutils""".split()
)


def screen(body: str, indent: str, file_source: str, whole_functions: list[str] | None = None) -> list[str]:
    """Why `body` (the lines between a region's markers, indented by `indent`) may not run; [] if it may.

    `file_source` is the teacher's file the body goes into: its names are what the body may use.
    `whole_functions` lists the functions a region of whole functions must define (None: a region of statements).
    """
    reasons = _outside_the_region(body, indent)
    if reasons:
        return reasons
    try:
        tree = ast.parse(textwrap.dedent(body) if body.strip() else "pass")
    except SyntaxError as e:
        return [f"line {e.lineno}: does not parse on its own ({e.msg})"]
    if whole_functions is not None:
        reasons += _defines_the_functions(tree, whole_functions)
    modules, known = _file_names(file_source)
    known |= _bound_names(tree) | SAFE_BUILTINS
    for node in ast.walk(tree):
        reasons += [f"line {node.lineno}: {why}" for why in _refuse(node, modules, known)]
    return sorted(set(reasons), key=lambda r: int(r.split(":")[0].split()[1]))


def _outside_the_region(body: str, indent: str) -> list[str]:
    """A line indented less than the region (not blank, not a comment) would end the enclosing block."""
    return [
        f"line {i}: indented less than the region: code outside it is not accepted"
        for i, line in enumerate(body.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#") and not line.startswith(indent)
    ]


def _defines_the_functions(tree: ast.Module, names: list[str]) -> list[str]:
    reasons = [
        f"line {node.lineno}: a region of whole functions holds only function definitions"
        for node in tree.body
        if not isinstance(node, ast.FunctionDef)
    ]
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [name for name in names if name not in defined]
    return reasons + ([f"line 1: the region must define {', '.join(missing)}"] if missing else [])


def _refuse(node: ast.AST, modules: set[str], known: set[str]) -> list[str]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return ["imports are not accepted: use what the file already imports"]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return [f"{type(node).__name__.lower()} is not accepted"]
    if isinstance(node, (ast.ClassDef, ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
        return [f"{type(node).__name__} is not accepted in a region"]
    if isinstance(node, ast.Name):
        if node.id in FORBIDDEN_NAMES or node.id.startswith("__"):
            return [f"the name {node.id!r} is not accepted"]
        if node.id not in known:
            return [f"the name {node.id!r} is neither in this file, a safe builtin, nor bound here"]
    if isinstance(node, ast.Attribute):
        if node.attr in FORBIDDEN_ATTRIBUTES or _is_dunder(node.attr):
            return [f"the attribute {node.attr!r} is not accepted"]
        if node.attr.startswith("_") and _rooted_at(node, modules):
            return [f"{node.attr!r}: below a module's public names is not accepted"]
    if isinstance(node, ast.FunctionDef) and node.name.startswith("__") and node.name != "__init__":
        return [f"defining {node.name!r} is not accepted"]
    return []


def _is_dunder(attribute: str) -> bool:
    """`__class__`, `__globals__`: the interpreter's. A private `__next` (no trailing underscores) is renamed by
    Python to the class's own `_Class__next` inside a class body, and names nothing special outside one."""
    return attribute.startswith("__") and (attribute.endswith("__") or len(attribute) <= 3)


def _rooted_at(node: ast.Attribute, modules: set[str]) -> bool:
    """Whether an attribute chain like torch.nn._x starts at a module the file imported."""
    value = node.value
    while isinstance(value, ast.Attribute):
        value = value.value
    return isinstance(value, ast.Name) and value.id in modules


def _file_names(source: str) -> tuple[set[str], set[str]]:
    """(names the file binds to modules, every name the file binds or uses), minus the forbidden ones."""
    tree = ast.parse(source)
    modules = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    names = _bound_names(tree) | {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return modules, {name for name in names if name not in FORBIDDEN_NAMES and not name.startswith("__")}


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name a tree binds: assignments, loop and with targets, arguments, definitions, imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names
