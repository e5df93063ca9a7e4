"""The demo opens JupyterLab on the welcome notebook at a user's first start, on the launcher
afterwards (hub_ext/demo_config.py ``welcome_on_first_start``, the demo's pre-spawn hook); the
demo's homes carry the serving example. The real first start: tests/test_hub_demo.py."""
from __future__ import annotations

from types import SimpleNamespace

from gpupool.hub_ext import demo_config


def test_the_first_start_opens_the_welcome_notebook_and_later_ones_the_launcher(tmp_path):
    path = demo_config.write_demo(tmp_path / ".gpupool-demo", demo_config.DemoOptions(port=18950))
    home = tmp_path / ".gpupool-demo" / "homes" / "alice"
    spawner = SimpleNamespace(home_dir=str(home), default_url="/lab")
    demo_config.welcome_on_first_start(spawner)
    assert spawner.default_url == "/lab/tree/demo.ipynb" and (home / demo_config.WELCOMED).is_file()
    demo_config.welcome_on_first_start(spawner)  # the same spawner, started again
    assert spawner.default_url == "/lab"
    (home / demo_config.WELCOMED).unlink()  # deleted: the welcome once more
    demo_config.welcome_on_first_start(spawner)
    assert spawner.default_url == "/lab/tree/demo.ipynb"
    # the generated config installs the hook, and the homes have the model server of docs/endpoints.md
    text = path.read_text()
    assert "c.Spawner.pre_spawn_hook = welcome_on_first_start" in text
    assert (home / "serve_model.py").is_file() and (home / "train.ipynb").is_file()


def test_a_home_without_the_welcome_notebook_opens_the_launcher(tmp_path):
    spawner = SimpleNamespace(home_dir=str(tmp_path), default_url="/lab")
    demo_config.welcome_on_first_start(spawner)
    assert spawner.default_url == "/lab" and not (tmp_path / demo_config.WELCOMED).exists()
