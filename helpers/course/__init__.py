"""Course tools that no training program imports: the book runner (papermill),
lab release and grading (nbgrader), and the benchmarks that print figures."""
