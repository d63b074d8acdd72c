"""tools/pip_as_uv.py: pip's settings as uv's arguments (tools/bootstrap.sh installs through uv with them)."""

from __future__ import annotations

import sys

from tests.tools.conftest import load_tool

LISTED = [  # `pip config list` on a machine like CI's
    ":env:.cert='/etc/ssl/certs/ca-certificates.crt'",
    ":env:.default-timeout='180'",
    ":env:.disable-pip-version-check='1'",
    ":env:.find-links='/opt/wheels'",
    "global.constraint='/etc/xdg/pip/constraints.txt'",
    "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
    "global.find-links='/opt/wheels'",
]


def test_the_machines_settings_become_the_same_indexes_links_and_constraints():
    tool = load_tool("pip_as_uv")
    args, env, unknown = tool.translate(tool.settings(LISTED))
    assert unknown == []
    assert args == ["--index-strategy", "unsafe-best-match", "--find-links", "/opt/wheels",
                    "--constraint", "/etc/xdg/pip/constraints.txt",
                    "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}


def test_the_environment_overrides_the_install_section_which_overrides_global_and_no_index_is_a_flag():
    tool = load_tool("pip_as_uv")
    listed = [":env:.find-links='/e'", "global.find-links='/g'", "global.index-url='https://a/simple'",
              "global.no-index='true'", "install.find-links='/i'", "install.index-url='https://b/simple'",
              "list.format='json'"]  # sorted, as pip lists them; `list`'s section is not install's
    args, _, unknown = tool.translate(tool.settings(listed))
    assert unknown == []
    assert args == ["--index-strategy", "unsafe-best-match", "--find-links", "/e", "--index-url", "https://b/simple",
                    "--no-index"]


def test_a_setting_without_a_translation_sends_the_caller_to_pip(tmp_path, capsys):
    tool = load_tool("pip_as_uv")
    fake = tmp_path / "pip.py"
    fake.write_text("import sys\nprint(\"global.proxy='http://10.0.0.1:3128'\")\nprint(\"global.find-links='/w'\")\n")
    assert tool.main(["--pip", f"{sys.executable} {fake}"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "pip_as_uv: no uv translation for pip's setting(s) proxy", err
    fake.write_text("print(\"global.find-links='/w'\")\nprint(\":env:.cert='/c.pem'\")\n")
    assert tool.main(["--pip", f"{sys.executable} {fake}"]) == 0
    assert capsys.readouterr().out.splitlines() == ["--index-strategy", "unsafe-best-match", "--find-links", "/w",
                                                    "ENV SSL_CERT_FILE=/c.pem"]
