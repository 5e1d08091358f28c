"""The maintainers' and set-up tools of the course, run from the repository root with ``python -m tools.<name>``.

Not installed with ``course_utils`` (pyproject installs only that package): the
tools build and check the notebooks (``build_notebooks``, ``notebook_source``,
``notebook_watchdog``, ``notebook_widgets``, ``lesson_times``), set up the environment
(``check_python``, ``pip_install``, ``install_torch``), open the course
(``open_lab``, and ``course_kernel``, which the course's kernelspec starts) and
write the lessons' cached results (``lesson5_seed_runs``, ``lesson7_sharding_plans``).
``check_python`` must run on any Python 3, so this file stays plain.
"""
