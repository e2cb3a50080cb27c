"""The .pyi stubs describe the compiled module: same names, same signatures."""

import ast
import inspect
import pathlib

import pytest

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
    # The package exports exactly the public API; the vLLM hook's capture types
    # (engine_state.vllm) are underscored, stubbed, in neither __all__, and not
    # re-exported by the package.
    assert set(engine_state.__all__) == public
    internal = {"_RequestCapture", "_IncrementalCapture", "_RequestTotals"}
    assert internal <= stubbed - stubbed_public
    for name in internal:
        assert hasattr(_native, name), name
        assert name not in _native.__all__ and name not in engine_state.__all__, name
        assert not hasattr(engine_state, name), name
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


def stub_class(name):
    (cls,) = [n for n in stub_tree().body if isinstance(n, ast.ClassDef) and n.name == name]
    return cls


def stub_method(cls, name):
    (method,) = [i for i in cls.body if isinstance(i, ast.FunctionDef) and i.name == name]
    return method


def stub_attributes(cls):
    return [i.target.id for i in cls.body if isinstance(i, ast.AnnAssign)]


# What the stub must spell is checked against the Rust owner of the field list
# (shm-format's snapshot_fields!, exported as FIELD_NAMES).


def test_publish_keywords_are_the_snapshot_fields(uri):
    publish = stub_method(stub_class("Publisher"), "publish")
    keywords = [a.arg for a in publish.args.kwonlyargs]
    # The stamps (capture clocks, cache digest words) are the publisher's own.
    settable = [n for n in _native.FIELD_NAMES if not n.startswith(("captured_", "cache_"))]
    assert keywords == settable
    runtime = inspect.signature(_native.Publisher.publish).parameters.values()
    assert [p.name for p in runtime if p.kind is p.KEYWORD_ONLY] == settable
    assert all(isinstance(d, ast.Constant) and d.value == 0 for d in publish.args.kw_defaults)
    with _native.Publisher(uri=uri, engine_id="stub-fields") as publisher:
        publisher.publish(**{n: 0 for n in keywords})
        for stamp in ("captured_mono_ns", "captured_unix_ns", "cache_blocks", "cache_version"):
            with pytest.raises(TypeError, match=f"unexpected keyword argument '{stamp}'"):
                publisher.publish(**{stamp: 1})


def test_engine_state_attributes_are_the_snapshot_fields():
    attributes = stub_attributes(stub_class("EngineState"))
    fields = [a for a in attributes if a in _native.FIELD_NAMES]
    assert fields == list(_native.FIELD_NAMES)
    for name in attributes:
        assert hasattr(_native.EngineState, name), name


def test_request_totals_attributes_are_the_request_sums():
    capture = _native._RequestCapture(
        prompt_attr="p",
        computed_attr="c",
        tokens_attr="t",
        tokens_is_sequence=False,
        status_attr="s",
        preempted_status=None,
    )
    totals = capture.capture([], [])
    # "_RequestTotals(num_running=0, ...)": the Rust accumulator's names, in its order.
    runtime = [part.split("=")[0] for part in repr(totals)[len("_RequestTotals(") : -1].split(", ")]
    assert stub_attributes(stub_class("_RequestTotals")) == runtime
    assert len(totals) == len(runtime)
    assert set(runtime) < set(_native.FIELD_NAMES)
    for name in runtime:
        assert getattr(totals, name) == 0
