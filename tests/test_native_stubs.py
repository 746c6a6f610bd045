"""The typed stubs of ffi_dsa/_native.py against the native modules: every stubbed function exists
and has the type schema the stub states (the module's own metadata), so the walk from the Python API
to the bindings that a reader follows through _native.py is the one that runs."""

from __future__ import annotations

import pytest
from tvm_ffi.core import TypeSchema

from ffi_dsa import _ffi_api, _native


def schemas_of(module, table) -> dict[str, str]:
    found = {}
    for name in table._fields:
        metadata = module.get_function_metadata(name)
        assert metadata is not None, f"{name}: the module exports no metadata for it (or no such function)"
        found[name] = str(TypeSchema.from_json_str(metadata["type_schema"]))
    return found


def test_cpu_stubs_match_the_module():
    assert schemas_of(_ffi_api.cpu_module(), _native.CpuFunctions) == _native.SCHEMAS[_native.CpuFunctions]
    assert _ffi_api.cpu().topk_indexer is _ffi_api.kernel_for("topk_indexer", "cpu")


@pytest.mark.cuda
def test_cuda_stubs_match_the_module():
    assert schemas_of(_ffi_api.cuda_module(), _native.CudaFunctions) == _native.SCHEMAS[_native.CudaFunctions]


def test_every_stub_states_a_schema():
    for table, schemas in _native.SCHEMAS.items():
        assert set(schemas) == set(table._fields), table.__name__
