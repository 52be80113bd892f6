"""Every user mistake gets exit 2, one line on stderr naming the key or file, and touches no output.

Table-driven: each row is a stage, its arguments, what to break first, and a
fragment the one error line must contain.
"""

import hashlib
import os

import numpy as np
import pytest
from click.testing import CliRunner

from stages import evaluate, preprocess, train

from helpers.project import tiny_params


def set_(*items):
    return [arg for item in items for arg in ("--set", item)]


SHARD = "train-00003-of-00016.tfrecord"


def truncate_train(workdir):
    path = workdir / "data" / "prepared" / SHARD
    path.write_bytes(path.read_bytes()[:1000])


def remove_train(workdir):
    (workdir / "data" / "prepared" / SHARD).unlink()


def remove_spec(workdir):
    (workdir / "data" / "prepared" / "spec.json").unlink()


def bad_yaml(workdir):
    (workdir / "params.yaml").write_text("train:\n  epochs: [3\n")


def idx_folder_with_bad_magic(workdir):
    folder = workdir / "mnist-idx"
    folder.mkdir()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (folder / stem).write_bytes(b"\x00\x00\x08\x07" + b"\x00" * 12)


def image_folder_with(hostile):
    """A folder of two classes of real PNG images, one entry of which is ``hostile(path)``'s making."""
    def prepare(workdir):
        from PIL import Image

        for name in ("a", "b"):
            (workdir / "images" / name).mkdir(parents=True)
            for i in range(7):  # enough of each class for the held-out splits
                Image.new("L", (8, 8), color=30 * i).save(workdir / "images" / name / f"{i}.png")
        hostile(workdir / "images" / "b" / "bad.png")
    return prepare


def png_declaring(width, height):
    """A PNG of a few bytes whose header declares ``width`` x ``height`` pixels (a decompression bomb's header)."""
    def write(path):
        import struct
        import zlib

        from PIL import Image

        Image.new("L", (1, 1)).save(path)
        data = bytearray(path.read_bytes())
        ihdr = data[12:29]
        ihdr[4:12] = struct.pack(">II", width, height)
        data[12:29] = ihdr
        data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
        path.write_bytes(bytes(data))
    return write


def fifo(path):
    os.mkfifo(path)


def link_out(path):
    path.symlink_to("/etc/hostname")


def idx_folder(images_header, body=b"", gz=False):
    """An IDX folder whose training images have ``images_header`` (dims after the magic) and ``body``."""
    def prepare(workdir):
        import gzip
        import struct

        folder = workdir / "mnist-idx"
        folder.mkdir()
        files = {"train-images-idx3-ubyte": b"\x00\x00\x08\x03" + struct.pack(">3I", *images_header) + body,
                 "train-labels-idx1-ubyte": b"\x00\x00\x08\x01" + struct.pack(">I", 2) + b"\x00\x01",
                 "t10k-images-idx3-ubyte": b"\x00\x00\x08\x03" + struct.pack(">3I", 1, 2, 2) + bytes(4),
                 "t10k-labels-idx1-ubyte": b"\x00\x00\x08\x01" + struct.pack(">I", 1) + b"\x00"}
        for name, data in files.items():
            if gz:
                with gzip.open(folder / f"{name}.gz", "wb", compresslevel=9) as handle:
                    handle.write(data)
            else:
                (folder / name).write_bytes(data)
    return prepare


def npz_declaring_a_huge_array(workdir):
    """An .npz whose x's header declares 2^50 bytes over a few bytes of data."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (2 ** 50,)})
    with zipfile.ZipFile(workdir / "huge.npz", "w") as archive:
        archive.writestr("x.npy", header.getvalue() + bytes(16))
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(2, dtype=np.int64))
        archive.writestr("y.npy", buffer.getvalue())


TRAIN = ["--strategy", "default", "--name", "run"]
CASES = [
    # (id, stage, args, prepare, fragment of the one error line)
    ("unknown key", train, TRAIN + set_("train.epoch=3"), None, "unknown key train.epoch; did you mean train.epochs?"),
    ("unknown section", train, TRAIN + set_("trian.epochs=3"), None, "unknown key trian; did you mean train?"),
    ("wrong type", train, TRAIN + set_("train.epochs=three"), None, "train.epochs must be"),
    ("epochs 0", train, TRAIN + set_("train.epochs=0"), None, "train.epochs must be >= 1; got 0"),
    ("batch 0", train, TRAIN + set_("train.batch_size=0"), None, "train.batch_size must be >= 1; got 0"),
    ("learning rate 0", train, TRAIN + set_("train.learning_rate=0"), None, "train.learning_rate must be > 0"),
    ("dropout 1", train, TRAIN + set_("model.dropout=1"), None, "model.dropout must be < 1"),
    ("dropout negative", train, TRAIN + set_("model.dropout=-0.1"), None, "model.dropout must be >= 0"),
    ("validation split 1", train, TRAIN + set_("data.validation_split=1.0"), None, "data.validation_split must be < 1"),
    ("workers 0", train, TRAIN + set_("distributed.workers=0"), None, "distributed.workers must be >= 1; got 0"),
    ("devices 0", train, TRAIN + set_("distributed.devices=0"), None, "distributed.devices must be >= 1; got 0"),
    ("ps 0", train, TRAIN + set_("distributed.ps=0"), None, "distributed.ps must be >= 1; got 0"),
    ("max restarts negative", train, TRAIN + set_("distributed.max_restarts=-1"), None,
     "distributed.max_restarts must be >= 0"),
    ("unknown strategy in list", train, TRAIN + set_("distributed.strategies=[mirrored, bogus]"), None,
     "distributed.strategies[1] must be one of one_device, mirrored"),
    ("unknown --strategy", train, ["--strategy", "bogus", "--name", "run"], None,
     "unknown strategy 'bogus'; choose one of default, one_device"),
    ("unknown loop", train, TRAIN + set_("train.loop=manual"), None, "train.loop must be one of fit, custom; got 'manual'"),
    ("unknown precision", train, TRAIN + set_("train.precision=float16"), None,
     "train.precision must be one of float32, mixed_float16, mixed_bfloat16; got 'float16'"),
    ("unknown clip method", train, TRAIN + set_("train.clip.method=l2"), None,
     "train.clip.method must be one of none, global_norm, norm, value; got 'l2'"),
    ("clip value 0", train, TRAIN + set_("train.clip.value=0"), None, "train.clip.value must be > 0"),
    ("unknown lr scaling", train, TRAIN + set_("train.lr_scaling=sqrt"), None, "train.lr_scaling must be one of none, linear"),
    ("negative warm-up", train, TRAIN + set_("train.warmup_epochs=-1"), None, "train.warmup_epochs must be >= 0"),
    ("--set without =", train, TRAIN + set_("train.epochs"), None, "must look like dotted.key=value"),
    ("--set bad YAML", train, TRAIN + set_("train.epochs=[1"), None, "value '[1' is not valid YAML"),
    ("params not YAML", train, TRAIN, bad_yaml, "params.yaml is not valid YAML at line"),
    ("params missing", train, ["--params", "nope.yaml", *TRAIN], None, "params file nope.yaml not found"),
    ("float16 without loss scaling", train, ["--strategy", "central_storage", "--name", "run",
                                             *set_("train.precision=mixed_float16")], None,
     "train.precision mixed_float16 needs loss scaling"),
    ("unknown gradient compression", train, TRAIN + set_("distributed.gradient_compression=int8"), None,
     "distributed.gradient_compression must be one of none, float16, bfloat16; got 'int8'"),
    ("compression with no all-reduce listed", train, ["--strategy", "default", "--name", "normal",
                                                      *set_("distributed.gradient_compression=float16")], None,
     "distributed.gradient_compression float16 compresses the gradients multi_worker_mirrored all-reduces between "
     "processes; mirrored has no such all-reduce to compress"),
    ("compression under parameter_server", train, ["--strategy", "parameter_server", "--name", "ps",
                                                   *set_("distributed.strategies=[multi_worker_mirrored]",
                                                         "distributed.gradient_compression=bfloat16")], None,
     "parameter_server has no such all-reduce to compress: list only multi_worker_mirrored"),
    ("prepared shard missing", train, TRAIN, remove_train, f"{SHARD} not found; run the preprocess stage first"),
    ("prepared shard truncated", train, TRAIN, truncate_train, f"{SHARD} has 1000 bytes, "),
    ("prepared spec missing", train, TRAIN, remove_spec, "spec.json not found; run the preprocess stage"),
    ("source path missing", preprocess, set_("data.source=no/such/mnist.npz"), None, "data.source"),
    ("IDX bad magic", preprocess, set_("data.source=mnist-idx"), idx_folder_with_bad_magic, "bad IDX magic number"),
    ("PNG declaring 20000x20000", preprocess, set_("data.source=images"), image_folder_with(png_declaring(20000, 20000)),
     "bad.png declares more pixels than 64,000,000"),
    ("PNG declaring 9000x9000", preprocess, set_("data.source=images"), image_folder_with(png_declaring(9000, 9000)),
     "bad.png declares 9000x9000 pixels, more than 64,000,000"),
    ("a pipe in a class folder", preprocess, set_("data.source=images"), image_folder_with(fifo),
     "bad.png is not a regular file (a pipe, socket or device)"),
    ("a link out of the source", preprocess, set_("data.source=images"), image_folder_with(link_out),
     "bad.png links to /etc/hostname, outside"),
    ("IDX declaring 2^31 x 2^31", preprocess, set_("data.source=mnist-idx"), idx_folder((2 ** 31, 2 ** 31, 1)),
     "train-images-idx3-ubyte: IDX header promises (2147483648, 2147483648, 1) (4611686018427387920 bytes) but the "
     "file has 16 bytes"),
    ("IDX gz inflating past its header", preprocess, set_("data.source=mnist-idx"),
     idx_folder((2, 28, 28), bytes(64_000_000), gz=True), "but the file has more bytes"),
    ("npz declaring 2^50 bytes", preprocess, set_("data.source=huge.npz"), npz_declaring_a_huge_array,
     "array x's header declares it, 1,125,899,906,842,624 bytes, more than the "),
    ("evaluate without model", evaluate, ["--name", "never-trained"], None, "never-trained"),
    ("register without logging", train, TRAIN + set_("mlflow.register_models=true", "mlflow.log_models=false"), None,
     "mlflow.register_models needs mlflow.log_models: true"),
    ("password in the tracking URI", train, TRAIN + set_("mlflow.tracking_uri=postgresql://me:hunter2@db/tfdist"), None,
     "mlflow.tracking_uri holds a password, which would be logged with every run and committed in dvc.lock"),
    ("password in the tracking URI's query", train,
     TRAIN + set_("mlflow.tracking_uri=postgresql://db/tfdist?user=me&password=hunter2"), None,
     "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (a server), or a line in ~/.pgpass"),
    ("task network unknown", train, TRAIN + set_("distributed.task_network=open"), None,
     "distributed.task_network must be one of private, host; got 'open'"),
    ("tracking store unwritable", train, TRAIN + set_("mlflow.tracking_uri=sqlite:///params.yaml/mlflow.db"), None,
     "mlflow.tracking_uri sqlite:///params.yaml/mlflow.db: cannot create "),
]


def snapshot(root):
    """Every file under ``root`` with its content hash (the lock files of a store aside)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*")) if path.is_file()
    }


@pytest.mark.parametrize(("stage", "args", "prepare", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_input_exits_2_with_one_line_and_changes_nothing(tmp_path, prepared_copy, monkeypatch,
                                                               stage, args, prepare, fragment):
    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path)
    if prepare:
        prepare(tmp_path)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(stage.main, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if not line.startswith(("INFO ", "WARNING "))]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr
    assert fragment in errors[0]
    assert "Traceback" not in result.output and "hunter2" not in result.output, "no secret is repeated"
    assert snapshot(tmp_path) == before, "no output was written or changed"


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "/tmp/abs", "", ".hidden", "new\nline", "x" * 101])
@pytest.mark.parametrize("stage", [train, evaluate])
def test_a_run_name_that_is_not_plain_exits_2_and_writes_nothing_anywhere(tmp_path, prepared_copy, monkeypatch,
                                                                          stage, name):
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "data").symlink_to(prepared_copy.parent)
    monkeypatch.chdir(workdir)
    tiny_params(workdir)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(stage.main, ["--name", name, *(["--strategy", "default"] if stage is train else [])])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: --name {name!r} is not a plain run name: use 1-100 letters, digits, '_', '.' or '-', "
        "not starting with '.', e.g. --name mirrored-bs256"]
    assert snapshot(tmp_path) == before and not (tmp_path.parent / "escaped").exists()


def test_a_nan_loss_fails_the_stage_and_its_mlflow_run_with_epoch_and_step(tmp_path, prepared_copy, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path, train={"optimizer": "sgd", "learning_rate": 1e30})
    result = CliRunner().invoke(train.main, TRAIN)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: training diverged: loss is")
    assert "lower train.learning_rate or clip gradients" in result.stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = mlflow.search_runs(experiment_names=["tests"], filter_string="tags.stage = 'train'", output_format="list")
    assert run.info.status == "FAILED"
    assert run.data.tags["diverged.epoch"] == "1" and int(run.data.tags["diverged.step"]) > 0
    assert not (tmp_path / "models" / "run").exists() and not (tmp_path / "reports" / "train" / "run.json").exists()


def test_an_unreachable_tracking_server_fails_before_training(tmp_path, prepared_copy, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path, mlflow={"tracking_uri": f"http://127.0.0.1:{port}"})
    result = CliRunner().invoke(train.main, TRAIN)
    assert result.exit_code == 2
    assert f"mlflow.tracking_uri http://127.0.0.1:{port}: no MLflow server answers" in result.stderr
    assert "Epoch 1/" not in result.output, "nothing was trained"


def test_nothing_secret_from_the_environment_reaches_mlflow(tmp_path, prepared_copy, monkeypatch):
    import mlflow

    secret = "s3cr3t-" + os.urandom(4).hex()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("TFDIST_TEST_TOKEN", secret)
    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path, train={"epochs": 1})
    assert CliRunner().invoke(train.main, TRAIN).exit_code == 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = mlflow.search_runs(experiment_names=["tests"], filter_string="tags.stage = 'train'", output_format="list")
    logged = [*run.data.params.items(), *run.data.tags.items()]
    assert not [key for key, value in logged if secret in str(value)]
