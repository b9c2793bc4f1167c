import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.filterwarnings("ignore", category=UserWarning, module="tf_keras")
sys.path.insert(0, os.path.dirname(__file__))

_node_results: list[dict] = []


def pytest_runtest_logreport(report):
    """Collect the node suite's per-backend outcomes (on the xdist controller too)."""
    if report.when == "call" or (report.when == "setup" and report.skipped):
        props = dict(report.user_properties)
        if "op_type" in props:
            props["name"] = report.nodeid.split("[", 1)[-1].rstrip("]")
            _node_results.append(props)


def pytest_terminal_summary(terminalreporter, config):
    if not _node_results or hasattr(config, "workerinput"):  # the xdist controller reports
        return
    from conformance.summary import summarize, write_expectations

    terminalreporter.section("ONNX node suite")
    for line in summarize(_node_results):
        terminalreporter.write_line(line)
    if os.environ.get("ONNX2TF_ALT_WRITE_EXPECTATIONS"):
        count = write_expectations(_node_results)
        terminalreporter.write_line(f"wrote {count} lines to tests/conformance/expectations.txt")
