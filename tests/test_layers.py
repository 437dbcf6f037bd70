"""The layers point one way: io → tokenizer/data → model → train → generation/evaluate/serve → cli.

Read from the source (every ``import gptkit...`` of every module, in functions too), so a new upward
import fails here before it becomes an import circle. And every module and function is short enough
to read in one sitting.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gptkit"

# Lower numbers are lower layers; a module may import its own layer and those below.
LAYERS = {
    "gptkit.io": 0,
    "gptkit.config": 0,
    "gptkit.hardware": 0,
    "gptkit.native": 0,  # the native decoding kernels: ctypes over a library built on first use
    "gptkit.hub": 0,  # names and folders → local paths, for every loader
    "gptkit.progress": 0,  # progress bars drawn only on a terminal
    "gptkit.tokenizer": 1,
    "gptkit.data": 1,
    "gptkit.model": 2,
    "gptkit.model.weights": 2,
    "gptkit.model.task": 2,
    "gptkit.model.layouts": 2,
    "gptkit.train": 3,
    # Choosing tokens and the decoding loop over a model, below training: generation fine-tuning
    # scores its dev split by greedy answers. Text in and out, and loading, stay in generation's layer.
    "gptkit.generation.sampling": 3,
    "gptkit.generation.decode": 3,
    "gptkit.generation": 4,
    "gptkit.evaluate": 4,
    "gptkit.serve": 4,
    "gptkit.export": 4,
    "gptkit.demo": 5,
    "gptkit.paper": 5,
    "gptkit.cli": 5,
    "gptkit.cli_flags": 5,
    "gptkit.__main__": 5,
    "gptkit.testing": 5,  # what tests, benchmarks and scripts share: references, fixtures as functions
    "gptkit": 5,  # the package's public API gathers everything
}


def layer(module: str) -> int:
    while module not in LAYERS:
        module = module.rsplit(".", 1)[0]
    return LAYERS[module]


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported gptkit name, imported inside a function) for every import in the file.

    ``from gptkit.a import b`` gives ``gptkit.a.b``: ``b`` may be a module of the package ``gptkit.a``.
    """
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("gptkit"):
                found.extend((f"{child.module}.{a.name}", inner) for a in child.names)
            elif isinstance(child, ast.Import):
                found.extend((a.name, inner) for a in child.names if a.name.startswith("gptkit"))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def module_name(path: Path) -> str:
    name = ".".join(("gptkit", *path.relative_to(SRC).with_suffix("").parts))
    return name.removesuffix(".__init__")


def test_no_module_imports_a_higher_layer():
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        name = module_name(path)
        for target, _ in imports(path):
            if layer(target) > layer(name):
                upward.append(f"{name} imports {target}")
    assert not upward, "\n".join(upward)


def test_tokenizer_and_data_never_import_the_model():
    for path in sorted([*(SRC / "tokenizer").rglob("*.py"), *(SRC / "data").rglob("*.py")]):
        for target, _ in imports(path):
            assert layer(target) <= 1, f"{module_name(path)} imports {target}"


def test_no_import_circle():
    """Within a layer too, and counting imports inside functions: a lazy import only hides a circle
    until the function runs."""
    graph: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        name = module_name(path)
        graph[name] = {target for target, _ in imports(path)}
    known = set(graph)

    def resolve(target: str) -> str | None:  # the module a name is in ("gptkit.model.GPT": gptkit.model)
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    visiting, done, cycles = [], set(), []

    def visit(module: str) -> None:
        if module in done:
            return
        if module in visiting:
            cycles.append(" → ".join([*visiting[visiting.index(module) :], module]))
            return
        visiting.append(module)
        for target in graph.get(module, ()):
            resolved = resolve(target)
            # A package's __init__ importing its own modules is how packages work, not a circle.
            if resolved and not (module == resolved.rpartition(".")[0] or resolved == module):
                visit(resolved)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert not cycles, "\n".join(cycles)


# A room a newcomer reads in one sitting: a module at most this many lines, a function at most this.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 60


def long_functions(text: str, where: str) -> list[str]:
    """``where`` and each function of ``text`` longer than MAX_FUNCTION_LINES, with its length."""
    return [
        f"{where}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_every_module_and_function_of_the_package_reads_in_one_sitting():
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{module_name(path)}: {len(text.splitlines())} lines")
        too_long += long_functions(text, module_name(path))
    assert not too_long, "\n".join(too_long)


REPO = SRC.parents[1]
TOOLS = ("benchmarks", "scripts", "tests")


def test_every_function_of_the_tools_and_tests_reads_in_one_sitting():
    too_long = []
    for path in sorted(p for folder in TOOLS for p in (REPO / folder).rglob("*.py")):
        too_long += long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert not too_long, "\n".join(too_long)


def test_the_package_benchmarks_and_scripts_stand_without_the_tests():
    """What they share with the tests is gptkit.testing: none imports a test module or edits sys.path."""
    leaning = []
    for path in sorted(
        p for folder in (SRC, REPO / "benchmarks", REPO / "scripts") for p in folder.rglob("*.py")
    ):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "sys.path" in line or line.lstrip().startswith(("from tests", "import tests")):
                leaning.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not leaning, "\n".join(leaning)
