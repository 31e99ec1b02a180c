"""Root conftest: the plugins this project's own test suite uses (pytester; the loopback sshd tier)."""

pytest_plugins = ["pytester", "tests.conftest_ssh"]
