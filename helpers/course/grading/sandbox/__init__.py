"""The grading sandbox: learner code runs here, as nobody, unable to touch the course.

    pool = SandboxPool(max_world=4, course_root=course)   # pool.py: started once, reused
    pool.spawn(fn, world_size, args, learner_source=src, programs=progs) -> [values]
    pool.call(name, *args, learner_source=src, programs=progs) -> value

* ``bwrap``: the sandbox's command line (bubblewrap; setpriv to nobody when root),
  ``require()`` (a clear refusal where bwrap is missing), ``hidden_paths(course_root)``;
* ``pool``: ``SandboxPool``, the grader's side: slots started in parallel, a job's ranks
  one per slot, direct calls in the learner slot, values read as data;
* ``slot``, ``children``, ``rank``, ``learner``: what runs inside a sandbox (the slot that
  imported torch, its forked children, a rank's and the learner process's bodies, the
  learner namespace and the check that a value is data);
* ``wire``: the frames between them (JSON headers and raw bytes, never a pickle from a
  sandbox); ``outcome``: values, output lines and RankFailure on the grader's side.

``python -m helpers.course.grading.sandbox`` checks that sandboxing works on this machine
and prints what it costs (slot start-up, a direct call, a 2-rank job).
"""
