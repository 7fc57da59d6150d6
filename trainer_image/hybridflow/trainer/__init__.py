"""The RL loop (`ray_trainer.RayPPOTrainer`) and its entry point (`main_ppo`)."""
