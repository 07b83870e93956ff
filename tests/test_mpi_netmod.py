"""Which MPICH netmod a rank started by srun's pmi2 plugin gets (the real runs: test_vcluster.py)."""
from common.ranks.mpi import srun_pmi_netmod

WHEEL = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\nMPICH configure:    --with-device=ch4:ucx,ofi\n"
SRUN = {"SLURM_MPI_TYPE": "pmi2", "PMI_FD": "11", "PMI_RANK": "0"}


def test_the_mpich_wheel_under_srun_pmi2_uses_ofi():
    assert srun_pmi_netmod(SRUN, WHEEL) == "ofi"


def test_other_launchers_and_mpis_keep_their_default():
    assert srun_pmi_netmod({"PMI_FD": "7", "PMI_RANK": "0"}, WHEEL) is None  # hydra
    assert srun_pmi_netmod({**SRUN, "SLURM_MPI_TYPE": "pmix"}, WHEEL) is None
    assert srun_pmi_netmod(SRUN, "MPICH Version: 4.1\nMPICH Device: ch4:ucx\n") is None  # no OFI to switch to
    assert srun_pmi_netmod(SRUN, "Open MPI v5.0.3, package: Open MPI") is None


def test_a_netmod_the_user_chose_is_kept():
    assert srun_pmi_netmod({**SRUN, "MPIR_CVAR_CH4_NETMOD": "ucx"}, WHEEL) is None


def test_only_a_process_no_launcher_started_is_a_single_rank_without_mpi():
    from common.ranks.mpi import launched_by_mpi

    assert not launched_by_mpi({"PATH": "/usr/bin", "HOME": "/root", "SLURM_JOB_ID": "7"})  # a batch shell
    for name in ("PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "HYDRA_CONTROL_FD", "I_MPI_HYDRA_HOST_FILE",
                 "SLURM_PROCID", "SLURM_STEP_ID", "MV2_COMM_WORLD_RANK", "PALS_RANKID", "ALPS_APP_PE",
                 "JSM_NAMESPACE_RANK"):
        assert launched_by_mpi({"PATH": "/usr/bin", name: "0"}), name
