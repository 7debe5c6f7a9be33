"""``python app.py`` with no role: env, rollout and trainer as three local processes on one bucket,
with a landing page linking their UIs. Also the settings checks every role runs before it starts.

Modules: `config` (the launcher's settings), `checks` (what a role must be given), `children`
(starting, health-waiting and stopping one child process group), `landing` (the page on port 7860),
`launch` (add_arguments/run: the all-in-one start-up), `_guard` (each app's parent-death signal). Importing this package
imports nothing heavy.
"""
