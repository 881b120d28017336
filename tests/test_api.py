import subprocess
import sys

import gpufeed
from gpufeed import augment


def test_all_is_sorted_and_every_name_exists():
    for module in (gpufeed, augment):
        assert list(module.__all__) == sorted(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), name


def test_public_api_names_from_design_are_exported():
    assert {"DeviceLoader", "prefetch", "augment"} <= set(gpufeed.__all__)
    expected = {"Compose", "RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip", "Normalize", "RandomErasing"}
    assert expected | {"Cutout", "ConvertDtype"} <= set(augment.__all__)


def test_import_initialises_no_cuda_changes_no_torch_global_and_leaves_torchvision_unimported():
    # torchvision is imported where it is used: importing it imports torch._dynamo (torchvision.ops), 3-4 s that
    # every process would pay on `import gpufeed` (the CLI, each rank, each script the tests start)
    code = (
        "import sys, torch; before = (torch.get_default_dtype(), torch.backends.cudnn.benchmark, torch.initial_seed());"
        "import gpufeed, gpufeed.augment;"
        "after = (torch.get_default_dtype(), torch.backends.cudnn.benchmark, torch.initial_seed());"
        "print(torch.cuda.is_initialized(), before == after, 'torchvision' in sys.modules);"
        # the lazy API: each name loads on first use, and gf.diagnose stays the function once its module is loaded
        "import gpufeed.diagnose, gpufeed.pipeline.stream;"
        "print(gpufeed.diagnose is sys.modules['gpufeed.diagnose'].diagnose, callable(gpufeed.stream),"
        " gpufeed.DeviceLoader.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "False", "True", "True", "gpufeed.loading.loader"]


def test_the_command_lines_help_imports_no_torchvision_nor_pil():
    # every CLI call pays what building its parser imports: `gpufeed --help` took 1.9x `import torch` when the
    # parser's model and loader names came with the training loop (and torchvision, the datasets)
    code = (
        "import sys\nfrom gpufeed.cli.main import main\n"
        "for argv in (['--help'], ['train', '--help'], ['diagnose', '--help'], ['convert', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print('torchvision' in sys.modules, 'PIL' in sys.modules, file=sys.stderr)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stderr.split() == ["False", "False"] and "gpufeed train" in run.stdout


def test_the_code_passes_the_linter_the_formatter_and_the_type_checker():
    """What `make lint` runs, here too, so CI catches a lapse."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for cmd in (
        ["-m", "ruff", "check", "src", "tests", "benchmarks"],
        ["-m", "ruff", "format", "--check", "src", "tests", "benchmarks"],
        ["-m", "mypy"],
    ):
        run = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=root)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def test_the_version_is_the_one_the_package_is_built_with():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert gpufeed.__version__ == project["version"]
