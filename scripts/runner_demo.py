"""The main job end to end on the embedded default: Spark local[*], no cluster, no cloud.

Runs a 2-rank Horovod allreduce and a short data-parallel PyTorch training
through HorovodRunner in a Spark barrier stage, and prints rank 0's results.
"""

import logging
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def allreduce():
    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import log_to_driver

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    log_to_driver(f"rank {hvd.rank()} of {hvd.size()}: allreduce sum = {total}")
    return total


def train(epochs, lr):
    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import log_to_driver

    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=lr * hvd.size()),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(1000 + hvd.rank())  # each rank its own shard
    x = torch.randn(2048, 8, generator=gen)
    y = (x ** 2).sum(dim=1, keepdim=True)
    for epoch in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        loss = hvd.allreduce(loss.detach(), name="loss").item()
        if epoch % 20 == 0 or epoch == epochs - 1:
            log_to_driver(f"epoch {epoch} loss {loss:.4f}")
    return {"final_loss": loss}


def main():
    from pyspark.sql import SparkSession

    from airflow_provider_hvd import HorovodRunner

    spark = (SparkSession.builder.master("local[*]").appName("airflow-provider-hvd demo")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    try:
        total = HorovodRunner(np=2).run(allreduce)
        assert total == 3.0, total
        metrics = HorovodRunner(np=2).run(train, epochs=100, lr=0.01)
        print(f"demo: allreduce sum {total}, training {metrics}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
