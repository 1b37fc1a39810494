"""`python -m tpuctl`."""

from tpuctl.cli.main import run

if __name__ == "__main__":
    run()
