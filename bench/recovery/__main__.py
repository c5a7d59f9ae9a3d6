import sys

from bench.common import run_tool

TOOLS = {
    "fault": "faults",  # one fault against one system at one rate, its summary printed
    "subject": "subject",  # the process a fault hits, driven by `fault` (internal)
}

sys.exit(run_tool("recovery", TOOLS))
