import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pytest_report_header(config):
    return f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, device for tests: {device()}"


def device() -> str:
    """Tests run on CUDA when HINTBACKEND_TEST_DEVICE=cuda (the GPU machine), else on CPU."""
    return os.environ.get("HINTBACKEND_TEST_DEVICE", "cpu")
