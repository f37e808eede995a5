"""What machine a benchmark ran on, to print beside its figures."""
import platform
import subprocess


def cpu_model():
    """`lscpu`'s model name (the processor's, where lscpu has none)."""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()
