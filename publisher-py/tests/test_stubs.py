"""The .pyi stubs describe the compiled module: same names, same signatures."""

import ast
import inspect
import pathlib

import engine_state
from engine_state import _native

STUBS = pathlib.Path(engine_state.__file__).with_name("_native.pyi")


def stub_tree():
    return ast.parse(STUBS.read_text())


def test_stub_file_ships_with_py_typed():
    assert STUBS.exists()
    assert STUBS.with_name("py.typed").exists()


def test_every_public_name_is_stubbed_and_exported():
    tree = stub_tree()
    stubbed = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    stubbed |= {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign)}
    stubbed |= {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
    public = {n for n in dir(_native) if not n.startswith("_")} | {"__version__"}
    stubbed_public = {n for n in stubbed if not n.startswith("_")} | ({"__version__"} & stubbed)
    assert public == stubbed_public
    # The vLLM hook's internal names (its capture types) are stubbed privately, and exist.
    for name in stubbed - stubbed_public:
        assert hasattr(_native, name), f"{name} is stubbed but missing"
    # RequestCapture and IncrementalCapture serve the vLLM hook (engine_state.vllm), not users.
    assert set(engine_state.__all__) == public - {"RequestCapture", "IncrementalCapture"}
    assert not [n for n in public if "Capture" in n or "Totals" in n], public


def test_methods_and_parameters_match():
    for cls in (n for n in stub_tree().body if isinstance(n, ast.ClassDef)):
        runtime = getattr(_native, cls.name)
        for item in cls.body:
            if not isinstance(item, ast.FunctionDef):
                continue
            assert hasattr(runtime, item.name), f"{cls.name}.{item.name} is stubbed but missing"
            if item.name.startswith("__") or any(
                isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
            ):
                continue
            stub_params = [a.arg for a in item.args.args[1:]] + [a.arg for a in item.args.kwonlyargs]
            sig = inspect.signature(getattr(runtime, item.name))
            assert stub_params == [p for p in sig.parameters if p != "self"], f"{cls.name}.{item.name}"
        init = next(
            (
                i
                for i in cls.body
                if isinstance(i, ast.FunctionDef) and i.name in ("__init__", "__new__")
            ),
            None,
        )
        if init is not None:
            stub_params = [a.arg for a in init.args.args[1:]] + [a.arg for a in init.args.kwonlyargs]
            assert stub_params == list(inspect.signature(runtime).parameters), cls.name


def test_module_functions_match():
    for fn in (n for n in stub_tree().body if isinstance(n, ast.FunctionDef)):
        runtime = getattr(_native, fn.name)
        stub_params = [a.arg for a in fn.args.args] + [a.arg for a in fn.args.kwonlyargs]
        assert stub_params == list(inspect.signature(runtime).parameters), fn.name


def test_publisher_stats_keys_match(uri):
    (stats_type,) = [
        n.value
        for n in stub_tree().body
        if isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["_PublisherStats"]
    ]
    stubbed = [key.value for key in stats_type.args[1].keys]
    with _native.Publisher(uri=uri, engine_id="stub-keys") as publisher:
        assert sorted(publisher.stats()) == sorted(stubbed)
