"""Issue 42 point 3: every knob is a typed field of the one settings object (gateway/settings.py). Product code
reads os.environ / os.getenv only where a line below says why; setting a variable for a library (HF_HUB_OFFLINE,
OpenMP's) is a write, not a read, and is not listed."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("core", "gateway", "routing", "cache", "policies", "backends")
_ENVIRONMENT = {"environ", "environb", "getenv", "getenvb"}  # os.putenv and os.unsetenv only write
_WRITES = {"setdefault", "update", "pop", "clear"}  # os.environ.<these>(...) as a statement: a write

# (file, function, expression) -> why it may read the environment
ALLOWED = {
    ("core/models.py", "DeploymentConfig.api_key", "os.environ.get(self.api_key_env)"):
        "an upstream's key is read from the variable its deployment names (api_key_env), by design: secrets "
        "stay out of the YAML file, and LLMGW_* variables may not be named",
    ("gateway/metrics.py", "render_metrics", 'os.environ.get("PROMETHEUS_MULTIPROC_DIR")'):
        "prometheus_client's own contract: set (by `llmgw serve --workers N`, or the operator), the library "
        "records every worker's metrics in that directory, and /metrics must collect them from there",
    ("cache/onnx_export.py", "default_onnx_dir", 'os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")'):
        "the XDG base-directory convention, for the default of the cache.onnx_dir setting (which wins)",
    ("backends/local.py", "LocalEngineBackend.start", "os.environ"):
        "the engine's child process inherits the gateway's environment (PATH, CUDA, HF_*), plus its typed "
        "engine settings as LLMGW_ENGINE__* variables",
    ("backends/local_engine/server/serve.py", "run", "os.environ"):
        "`llmgw engine serve` reads its typed EngineSettings from LLMGW_ENGINE__* (settings_from validates "
        "them): the engine's own settings object",
    ("backends/local_engine/engine/threads.py", "configure_openmp", 'os.environ.get("GOMP_SPINCOUNT")'):
        "OpenMP's own variable: is the spin count in the environment the one this function set (inherited "
        "from an adaptive parent), to be removed for passive waits",
}  # fmt: skip


class _Reads(ast.NodeVisitor):
    """The environment reads of one module: (enclosing function, expression)."""

    def __init__(self, tree: ast.Module, source: str) -> None:
        self.source, self.scope, self.found = source, [], []
        self.modules, self.names = {"os"}, set()  # what `os` and os.environ / os.getenv are called here
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        self.visit(tree)

    def visit_Import(self, node: ast.Import) -> None:
        self.modules |= {alias.asname or alias.name for alias in node.names if alias.name == "os"}

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "os":
            self.names |= {alias.asname or alias.name for alias in node.names if alias.name in _ENVIRONMENT}

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.modules and node.attr in _ENVIRONMENT:
            self._found(node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.names:
            self._found(node)

    def _found(self, node: ast.expr) -> None:
        parent = self.parents[node]
        if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store | ast.Del):
            return
        if isinstance(parent, ast.Attribute) and isinstance(call := self.parents[parent], ast.Call):
            if parent.attr in _WRITES and isinstance(self.parents[call], ast.Expr):
                return
            node = call
        elif isinstance(parent, ast.Call) and parent.func is node:
            node = parent
        self.found.append((".".join(self.scope), ast.get_source_segment(self.source, node)))


def environment_reads() -> set[tuple[str, str, str]]:
    reads = set()
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            source = path.read_text()
            module = _Reads(ast.parse(source), source)
            reads |= {(str(path.relative_to(REPO)), scope, text) for scope, text in module.found}
    return reads


def test_no_environment_read_outside_the_allowlist() -> None:
    unexplained = environment_reads() - set(ALLOWED)
    assert not unexplained, (
        f"make these typed settings (or allow them here, saying why): {sorted(unexplained)}"
    )


def test_every_allowed_read_still_exists() -> None:
    assert not set(ALLOWED) - environment_reads(), "remove allowlist lines whose read is gone"


def test_the_scan_sees_reads_and_tells_writes_apart() -> None:
    source = (
        "import os as o\nfrom os import getenv as g\n"
        "def f():\n    o.environ['A'] = '1'\n    del o.environ['A']\n    o.environ.setdefault('B', '2')\n"
        "    o.putenv('G', '3')\n    return o.environ['C'], o.getenv('D'), g('E'), dict(o.environ), o.environ.setdefault('F', '')\n"
    )
    found = [text for _, text in _Reads(ast.parse(source), source).found]
    assert found == ["o.environ", "o.getenv('D')", "g('E')", "o.environ", "o.environ.setdefault('F', '')"]
