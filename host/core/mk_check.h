/* One family of check macros for CUDA, cuBLAS, NCCL and MPI calls: on failure they record the
 * statement, the library's message, file and line, and return a status from the
 * enclosing function. The library returns; only tools exit. */
#ifndef MK_CHECK_H
#define MK_CHECK_H

#include "mk_error.h"

#define MK_CHECK_BASE(status, ok, stmt, what)                                                                \
    do {                                                                                                     \
        if (!(ok)) return mk_fail((status), "%s failed: %s (%s:%d)", #stmt, (what), __FILE__, __LINE__);     \
    } while (0)

/* A failed runtime call also leaves a "last error" behind; consume it so the next,
 * unrelated launch check does not report it as its own. */
#define MK_CUDA_CHECK(stmt)                                                       \
    do {                                                                          \
        const cudaError_t mk_cuda_err_ = (stmt);                                  \
        if (mk_cuda_err_ != cudaSuccess) (void)cudaGetLastError();                \
        MK_CHECK_BASE(mk_cuda_error_status(mk_cuda_err_), mk_cuda_err_ == cudaSuccess, stmt, \
                      cudaGetErrorString(mk_cuda_err_));                          \
    } while (0)

#define MK_CUBLAS_CHECK(stmt)                                                                                \
    do {                                                                                                     \
        const cublasStatus_t mk_cublas_st_ = (stmt);                                                         \
        MK_CHECK_BASE(MK_ERR_CUBLAS, mk_cublas_st_ == CUBLAS_STATUS_SUCCESS, stmt,                            \
                      cublasGetStatusString(mk_cublas_st_));                                                 \
    } while (0)

#define MK_NCCL_CHECK(stmt)                                                                                  \
    do {                                                                                                     \
        const ncclResult_t mk_nccl_res_ = (stmt);                                                            \
        MK_CHECK_BASE(MK_ERR_NCCL, mk_nccl_res_ == ncclSuccess, stmt, ncclGetErrorString(mk_nccl_res_));     \
    } while (0)

/* MPI calls (host/stage/mpi/): the communicator must return errors (MPI_ERRORS_RETURN)
 * for this to see them rather than MPI aborting the job. */
#define MK_MPI_CHECK(stmt)                                                                                   \
    do {                                                                                                     \
        const int mk_mpi_rc_ = (stmt);                                                                       \
        char mk_mpi_msg_[MPI_MAX_ERROR_STRING] = "unknown MPI error";                                        \
        int mk_mpi_len_ = 0;                                                                                 \
        if (mk_mpi_rc_ != MPI_SUCCESS) MPI_Error_string(mk_mpi_rc_, mk_mpi_msg_, &mk_mpi_len_);             \
        MK_CHECK_BASE(MK_ERR_MPI, mk_mpi_rc_ == MPI_SUCCESS, stmt, mk_mpi_msg_);                             \
    } while (0)

/* Memory exhaustion and missing devices get their own statuses. */
#define mk_cuda_error_status(err)                                                                            \
    ((err) == cudaErrorMemoryAllocation ? MK_ERR_DEVICE_MEMORY                                               \
     : (err) == cudaErrorNoDevice || (err) == cudaErrorInsufficientDriver ? MK_ERR_NO_DEVICE                 \
     : (err) == cudaErrorInvalidDevice ? MK_ERR_DEVICE_INDEX                                                 \
                                       : MK_ERR_CUDA)

#endif
