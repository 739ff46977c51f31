import pytest

from ampshim.multi_tensor_apply import MultiTensorApply, multi_tensor_applier


def test_reports_unavailable_with_an_import_error():
    assert multi_tensor_applier.available is False
    assert isinstance(multi_tensor_applier.import_err, ImportError)
    assert "amp_C" in str(multi_tensor_applier.import_err)


def test_calling_it_raises_a_clear_error():
    with pytest.raises(RuntimeError, match=r"not available.*_foreach"):
        multi_tensor_applier(object(), None, [[], []], 1.0)


def test_new_instances_share_the_class_level_flags():
    applier = MultiTensorApply(1024)
    assert applier.chunk_size == 1024
    assert applier.available is False
