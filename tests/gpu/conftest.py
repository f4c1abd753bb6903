"""pytest collects tests/gpu/peft_parity.py although its name does not match test_*.py (the
name the CUDA issue gives it); a file named on the command line is collected by pytest itself."""
import pytest


def pytest_collect_file(file_path, parent):
    if file_path.name == "peft_parity.py" and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
