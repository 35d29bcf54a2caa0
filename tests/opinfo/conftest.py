import pytest

TALLY = []


def pytest_addoption(parser):
    parser.addoption("--opinfo-samples", type=int, default=4,
                     help="samples per operator in the OpInfo comparison (the full sweep: 1000)")
    parser.addoption("--opinfo-jobs", type=int, default=2, help="child processes at once")


def pytest_terminal_summary(terminalreporter):
    if TALLY:
        terminalreporter.section("OpInfo comparison with the CPU")
        for line in TALLY:
            terminalreporter.write_line(line)
