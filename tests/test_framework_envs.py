"""Framework images stand for their environment: built once from the package index,
cached, and refused at submission when their version cannot be had."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import put, require, wait_for
from tests.test_script_mode_job import script_job
from trainport.errors import ValidationError
from trainport.host import framework_envs
from trainport.host.framework_envs import check_available, environment_for, python_note
from trainport.host.frameworks import FrameworkImage, parse_image_uri
from trainport.jobs.service import JobService

SKLEARN_IMAGE = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"
TF_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/tensorflow-training:2.14.1-cpu-py310"
TORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-cpu-py311"


def image(uri: str) -> FrameworkImage:
    parsed = parse_image_uri(uri)
    assert parsed is not None
    return parsed


def test_scikit_learn_image_layers_its_release_and_what_its_container_ships() -> None:
    env = environment_for(image(SKLEARN_IMAGE), torch="2.13.0+cpu")
    assert env is not None
    assert (env.package, env.version) == ("scikit-learn", "1.2")
    # Built before numpy 2: the layer keeps numpy 1.
    assert env.requirements == ("scikit-learn==1.2.*", "numpy<2", "pandas", "scipy", "joblib")


def test_tensorflow_and_xgboost_layers() -> None:
    tf = environment_for(image(TF_IMAGE), torch=None)
    assert tf is not None and tf.requirements[:2] == ("tensorflow-cpu==2.14.1.*", "numpy<2")
    xgb = environment_for(image("sagemaker-xgboost:1.7-1"), torch=None)
    assert xgb is not None and xgb.requirements[0] == "xgboost==1.7.*"


def test_pytorch_images_play_on_the_interpreters_own_pytorch() -> None:
    assert environment_for(image(TORCH_IMAGE), torch="2.13.0+cpu") is None
    note = framework_envs.torch_note(image(TORCH_IMAGE), "2.13.0+cpu")
    assert note == f"image {TORCH_IMAGE} is PyTorch 2.3.0; this job runs PyTorch 2.13.0+cpu"
    assert framework_envs.torch_note(image(TORCH_IMAGE), "2.3.0+cpu") is None
    # Without PyTorch at all, the image's release is built.
    built = environment_for(image(TORCH_IMAGE), torch=None)
    assert built is not None and "torch==2.3.0.*" in built.requirements


def test_a_python_that_differs_from_the_images_is_said() -> None:
    assert python_note(image(TF_IMAGE), "3.11") == (
        f"image {TF_IMAGE} ships Python 3.10; this job runs Python 3.11, with tensorflow "
        "2.14.1 installed for it"
    )
    assert python_note(image(SKLEARN_IMAGE), "3.11") is None  # py3: any Python 3
    assert python_note(image(TORCH_IMAGE), "3.11") is None


def test_a_version_the_index_lacks_is_refused_naming_what_it_has() -> None:
    env = environment_for(image("sagemaker-scikit-learn:0.99-1-cpu-py3"), torch=None)
    assert env is not None
    with pytest.raises(ValidationError, match=r"scikit-learn 0\.99 cannot be had.*1\.1, 1\.2"):
        check_available(env, ("1.2.2", "1.2.1", "1.1.3"))
    check_available(env, None)  # the index could not be asked: the build will say more
    fine = environment_for(image(SKLEARN_IMAGE), torch=None)
    assert fine is not None
    check_available(fine, ("1.3.0", "1.2.2"))


SKLEARN_SCRIPT = """
import json, os, sys
import joblib, numpy, pandas, sklearn
from sklearn.linear_model import LogisticRegression
frame = pandas.read_csv(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "rows.csv"), header=None)
model = LogisticRegression().fit(frame[[0, 1]], frame[2])
joblib.dump(model, os.path.join(os.environ["SM_MODEL_DIR"], "model.joblib"))
print("SKLEARN " + json.dumps({"sklearn": sklearn.__version__, "numpy": numpy.__version__,
                               "score": model.score(frame[[0, 1]], frame[2]),
                               "python": sys.version_info[:2]}), flush=True)
"""


def _index_reachable() -> bool:
    return framework_envs.available_versions("scikit-learn") is not None


@pytest.mark.slow
def test_a_scikit_learn_job_named_by_its_image_runs_without_requirements(
    home: Path, service: JobService
) -> None:
    require(_index_reachable(), "the package index cannot be reached")
    rows = "".join(f"{i % 4},{(i * 7) % 5},{int(i % 4 > 1)}\n" for i in range(40))
    put(home, "data", "train/rows.csv", rows)
    runs = []
    for name in ("sklearn-1", "sklearn-2"):
        body = script_job(home, name, {"train.py": SKLEARN_SCRIPT}, "train.py")
        body["AlgorithmSpecification"]["TrainingImage"] = SKLEARN_IMAGE  # type: ignore[index]
        body["StoppingCondition"] = {"MaxRuntimeInSeconds": 900}
        service.create(body)
        record = wait_for(service, name, timeout=900)
        assert record.status == "Completed", record.failure_reason
        (line,) = [t for _, t in service.logs(name) if t.startswith("SKLEARN ")]
        runs.append(json.loads(line[len("SKLEARN ") :]))
        built = [t for _, t in service.logs(name) if "framework image: " in t]
        assert built and ("building" if name == "sklearn-1" else "reusing") in built[0]
    assert runs[0]["sklearn"].startswith("1.2.")
    assert runs[0]["numpy"].startswith("1.")
    assert runs[0]["score"] > 0.5
    assert runs[0] == runs[1]


def test_a_framework_version_the_index_lacks_is_refused_at_submission(
    home: Path, service: JobService
) -> None:
    require(_index_reachable(), "the package index cannot be reached")
    put(home, "data", "train/rows.csv", "1\n")
    body = script_job(home, "sklearn-none", {"train.py": "print(1)"}, "train.py")
    missing = SKLEARN_IMAGE.replace("1.2-1", "0.99-1")
    body["AlgorithmSpecification"]["TrainingImage"] = missing  # type: ignore[index]
    with pytest.raises(
        ValidationError, match=r"scikit-learn 0\.99 cannot be had.* it offers .*1\.2"
    ):
        service.create(body)
    assert not (home / "jobs" / "sklearn-none").exists()


def test_a_built_environment_is_not_asked_of_the_index_again(tmp_path: Path) -> None:
    from trainport.host import script_mode

    missing = SKLEARN_IMAGE.replace("1.2-1", "0.99-1")
    layer = framework_envs.layer_for(missing)
    assert layer is not None
    assert not script_mode.layer_built(layer.requirements, tmp_path)
    # As a finished build leaves it (the name is the lines' and the interpreter's digest).
    digest = script_mode._digest(
        script_mode.framework_lines(layer.requirements),
        script_mode._base_info(sys.executable),
    )
    (tmp_path / digest / "bin").mkdir(parents=True)
    (tmp_path / digest / "bin" / "python").symlink_to(sys.executable)
    assert script_mode.layer_built(layer.requirements, tmp_path)
    framework_envs.check_image(missing, tmp_path)  # not refused: nothing to fetch


def failed_layer_message(tmp_path: Path, *lines: str) -> str:
    """What building a framework layer of ``lines`` (which must fail) says, offline."""
    from trainport.host import script_mode

    code = tmp_path / "code"
    code.mkdir()
    with pytest.raises(ValidationError) as caught:
        layer = ("--no-index", *lines)
        script_mode.prepare_python(code, tmp_path / "envs", log=lambda line: None, framework=layer)
    return str(caught.value)


def test_a_layer_that_cannot_be_installed_names_the_image_not_requirements_txt(
    tmp_path: Path,
) -> None:
    message = failed_layer_message(tmp_path, "trainport-no-such-package==1.0")
    assert message.startswith("AlgorithmSpecification.TrainingImage: the packages its framework")
    assert "trainport-no-such-package==1.0" in message
    assert "fix requirements.txt" not in message
    assert not [p for p in (tmp_path / "envs").iterdir() if not p.name.endswith(".lock")]
