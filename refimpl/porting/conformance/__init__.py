"""The conformance suite: a versioned, port-neutral set of cases with reference traces (``suite``), and the
grader that reads a port's outputs and writes its report card (``grade``; ``report_html`` draws it).

    refimpl conformance make -o SUITE                 # the cases, their inputs and references, a manifest
    refimpl conformance grade SUITE RESULTS           # the report card; exit 0 all pass, 1 one fails, 2 unusable

docs/conformance.md is the port author's page."""
