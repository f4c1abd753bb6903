/* sgemm_rate.c - OpenBLAS sgemm throughput on the shapes of the example model's training
 * step (tokens x hidden x intermediate), the physical bound the CPU backend is compared to.
 * Usage: sgemm_rate [M N K [reps]]; prints one JSON line per shape. Not a test. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run(int M, int N, int K, int reps)
{
    float *a = malloc((size_t)M * K * 4), *b = malloc((size_t)K * N * 4), *c = malloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)K * N; i++) b[i] = (float)(i % 5) * 0.1f;
    /* y = x W^T as the forward does: x (M, K), W (N, K) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
        t = now() - t;
        if (t < best) best = t;
    }
    printf("{\"m\": %d, \"n\": %d, \"k\": %d, \"best_s\": %.6f, \"gflops\": %.2f, \"threads\": %d}\n",
           M, N, K, best, 2.0 * M * N * K / best / 1e9, openblas_get_num_threads());
    free(a); free(b); free(c);
}

int main(int argc, char **argv)
{
    if (argc >= 4) {
        run(atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 10);
        return 0;
    }
    run(512, 1536, 576, 10);   /* gate/up projection, 2 x 256 tokens */
    run(512, 576, 1536, 10);   /* down projection */
    run(512, 576, 576, 20);    /* q / o projection */
    run(64, 49152, 576, 5);    /* LM head chunk */
    return 0;
}
