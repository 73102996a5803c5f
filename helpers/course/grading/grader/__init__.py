"""The grader: a lab's tests run here, the learner's code only in the sandbox.

* ``cells``: the notebook as data (lab cells, tests, learner cells, programs);
* ``proxies``: learner names in the grader's namespace (``LearnerRef``);
* ``run``: ``grade(nb, directory, pool)``, the outputs of every cell as the grader decides;
* ``preprocessor``: ``GradeInSandbox``, nbgrader's step in place of ``Execute``.
"""
