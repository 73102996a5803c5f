"""JupyterHub for a workshop: PAM sign-in, each JupyterLab a Slurm job, nbgrader for the class.

Started by ``make hub`` (slurm/hub/start.sh), as root, from the workbook's venv; every
value comes from the environment (helpers.course.hub.workshop.settings_from_env, described in
docs/instructors.md, "A workshop hub"). What listens:

* the proxy, on HUB_URL (the only address learners need);
* the hub's API, on HUB_API_ADDRESS (the jobs call it: token-protected);
* the proxy's API and the formgrader service, on 127.0.0.1;
* each JupyterLab, on its node, on the address that node reaches the hub from
  (helpers.course.hub.job; its requests need the learner's OAuth cookie or the
  server's token).
"""

import secrets
import sys
from pathlib import Path

from jupyterhub.utils import random_port

from helpers.course.hub import spawner as hub_spawner
from helpers.course.hub import workshop as hub

c = get_config()  # noqa: F821 - injected by traitlets when JupyterHub loads this file

s = hub.settings_from_env()
people = hub.read_class(s.class_list)
learners, instructors = people["learner"], people["instructor"]
grader = instructors[0]  # the formgrader service runs as the first instructor, in the course dir
venv_bin = str(Path(sys.executable).parent)
run = s.state / "run"
hub_id_file = s.state / "hub-id"
if not hub_id_file.exists():
    hub_id_file.write_text(secrets.token_hex(4))
hub_id = hub_id_file.read_text().strip()

# ---- where things listen, and the hub's own files
c.JupyterHub.bind_url = s.url
c.JupyterHub.hub_bind_url = f"http://{s.api_address}:{random_port()}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{random_port()}"
c.ConfigurableHTTPProxy.pid_file = str(run / "proxy.pid")
c.JupyterHub.pid_file = str(run / "jupyterhub.pid")
c.JupyterHub.db_url = f"sqlite:///{s.state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(s.state / "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = True  # stopping the hub cancels every JupyterLab job

# ---- who may sign in: Unix users of the class list, with their Unix password
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False
c.Authenticator.allowed_users = set(learners) | set(instructors)
# nbgrader's JupyterHubAuthPlugin: nbgrader-COURSE takes the course,
# formgrade-COURSE grades it (instructors take it too, to see its assignments).
c.JupyterHub.load_groups = {
    f"nbgrader-{s.course}": {"users": learners + instructors},
    f"formgrade-{s.course}": {"users": instructors},
}
c.JupyterHub.load_roles = [
    {
        "name": "server",  # each JupyterLab's token: its owner's groups (for nbgrader)
        "scopes": [
            "users:activity!user",
            "access:servers!server",
            "read:users:name!user",
            "read:users:groups!user",
        ],
    },
    {
        "name": f"formgrade-{s.course}",  # the instructors reach the formgrader service
        "groups": [f"formgrade-{s.course}"],
        "scopes": [f"access:services!service={s.course}", "list:services"],
    },
    {
        "name": f"formgrader-{s.course}",  # the service reads and sets course groups
        "services": [s.course],
        "scopes": ["list:users", "read:users:name", "read:users:groups", "groups"],
    },
]

# ---- each JupyterLab: a Slurm job that runs as the learner
hub_spawner.install()  # the jobs' port callback accepts the port and nothing else
c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.SlurmSpawner.batch_script = hub.job_script(s, hub_id, venv_bin)
c.SlurmSpawner.exec_prefix = "sudo -E -u {username}"  # sbatch, squeue, scancel as the learner
# In the job: listen on the node's address that faces the hub, report the port when up.
c.SlurmSpawner.batchspawner_singleuser_cmd = "python -m helpers.course.hub.job serve"
c.SlurmSpawner.startup_poll_interval = 0.25
c.Spawner.start_timeout = 300  # a full queue: the learner waits, then is told to retry
c.Spawner.http_timeout = 60
c.Spawner.default_url = "/lab"
dirs = hub.write_configs(s, grader)


def _jupyter_config_path(spawner):
    role = "instructor" if spawner.user.name in instructors else "learner"
    return str(dirs["all"] if role == "instructor" else dirs["learner"])


c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": _jupyter_config_path,
    "NBGRADER_EXCHANGE": s.exchange,
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
}

# ---- the formgrader, a hub service for the course (nbgrader's "one class, many graders")
c.JupyterHub.services = [
    {
        "name": s.course,
        "url": f"http://127.0.0.1:{random_port()}",
        "command": [f"{venv_bin}/jupyterhub-singleuser"],
        "user": grader,
        "cwd": hub.course_dir(s, grader),
        "oauth_no_confirm": True,
        "environment": {
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "JUPYTER_CONFIG_PATH": str(dirs["all"]),
            "JUPYTERHUB_DEFAULT_URL": "/formgrader",
            "NBGRADER_EXCHANGE": s.exchange,
        },
    }
]
